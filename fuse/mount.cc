#include "fuse/mount.h"

#include <fcntl.h>
#include <fuse_lowlevel.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "base/log.h"

namespace ckptfs {
namespace {

std::string Unescape(const std::string& s) {  // mountinfo escapes space, tab, \n, \ as \ooo
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '\\' && i + 3 < s.size()) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8)));
      i += 3;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// Escapes a value for libfuse's -o parser (commas and backslashes).
std::string EscapeOpt(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == ',' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  return out;
}

bool Has(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// libfuse's command line for the session: the kernel mount options, with
// default_permissions wherever allow_other is, so that the kernel checks
// every user's access.
std::vector<std::string> SessionArgs(const std::string& backing, const FuseOptions& opts) {
  std::vector<std::string> kernel = opts.kernel_opts;
  if (Has(kernel, "allow_other") && !Has(kernel, "default_permissions")) kernel.push_back("default_permissions");
  std::string list = "fsname=" + EscapeOpt(backing) + ",subtype=ckptfs";
  for (const std::string& k : kernel) list += "," + k;
  std::vector<std::string> args = {"ckptfs", "-o", list};
  if (opts.debug) args.push_back("-d");
  return args;
}

// FUSE's INIT can only lower readahead; the mount's bdi sets the window.
void SetReadAhead(const std::string& mountpoint, uint64_t bytes) {
  for (const MountEntry& m : ReadMounts()) {
    if (m.mountpoint != mountpoint || m.fstype != "fuse.ckptfs") continue;
    std::ofstream out("/sys/class/bdi/" + m.dev + "/read_ahead_kb");
    out << bytes / 1024;
    if (!out) spdlog::warn("could not set readahead of {} ({}) to {} KiB", mountpoint, m.dev, bytes / 1024);
  }
}

}  // namespace

FuseMount::FuseMount(Store* store, const FuseOptions& opts, const std::string& mountpoint,
                     std::unique_ptr<Filesystem> fs)
    : store_(store), opts_(opts), mountpoint_(mountpoint), fs_(std::move(fs)) {
  fs_->SetAfterInit([this] { SetReadAhead(mountpoint_, opts_.read_ahead); });
}

Result<std::unique_ptr<FuseMount>> FuseMount::Mount(Store* store, const std::string& backing,
                                                    const std::string& mountpoint, const FuseOptions& opts) {
  ASSIGN_OR_RETURN(std::unique_ptr<Filesystem> fs, Filesystem::Open(store, opts.fs));
  std::unique_ptr<FuseMount> m(new FuseMount(store, opts, mountpoint, std::move(fs)));
  RETURN_IF_ERROR(m->CreateSession(backing));
  if (fuse_session_mount(m->session_, mountpoint.c_str()) != 0)
    return Status::Error(EIO, "could not mount on " + mountpoint + " (is /dev/fuse available and are you root?)");
  m->mounted_ = true;
  return m;
}

Status FuseMount::CreateSession(const std::string& backing) {
  session_args_ = SessionArgs(backing, opts_);
  for (std::string& s : session_args_) session_argv_.push_back(s.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(session_argv_.size()), session_argv_.data());
  session_ = fuse_session_new(&args, &Filesystem::Ops(), sizeof(fuse_lowlevel_ops), fs_.get());
  if (session_ == nullptr) return Status::Error(EIO, "could not create the FUSE session (see messages above)");
  if (fuse_set_signal_handlers(session_) != 0) return Status::Error(EIO, "could not install signal handlers");
  signal_handlers_ = true;
  return Status::Ok();
}

FuseMount::~FuseMount() {
  fs_->page_push().Stop();  // its thread writes to the session
  fs_->deferred().Stop();   // after the pushes its requests wait for; they are the session's
  Unmount();
  if (signal_handlers_) fuse_remove_signal_handlers(session_);
  if (session_ != nullptr) fuse_session_destroy(session_);
}

void FuseMount::Unmount() {
  if (mounted_) fuse_session_unmount(session_);
  mounted_ = false;
}

void FuseMount::StartSealing() {
  spdlog::info("sealing: {} file(s) at a time and one more small one, {} worker(s) per file",
               opts_.fs.seal_threads, store_->options().seal_workers);
  fs_->seals().Start();
  fs_->decode_ahead().Start();
  fs_->page_push().Start(session_);
  fs_->deferred().Start();
}

int FuseMount::Serve() {
  fuse_loop_config* loop = fuse_loop_cfg_create();
  fuse_loop_cfg_set_max_threads(loop, static_cast<unsigned>(opts_.max_threads));
  fuse_loop_cfg_set_clone_fd(loop, 0);
  const int rc = fuse_session_loop_mt(session_, loop);
  fuse_loop_cfg_destroy(loop);
  fs_->page_push().Stop();
  fs_->deferred().Stop();
  Unmount();
  fs_->seals().Drain();
  spdlog::info("unmounted {} (loop exit {})", mountpoint_, rc);
  return rc == 0 ? 0 : 1;
}

std::vector<MountEntry> ReadMounts() {
  std::vector<MountEntry> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::vector<std::string> f;
    for (std::string w; ss >> w;) f.push_back(w);
    size_t dash = 0;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (f.size() < 5 || dash + 2 >= f.size()) continue;
    out.push_back({Unescape(f[4]), Unescape(f[dash + 2]), f[dash + 1], f[2]});
  }
  return out;
}

std::optional<MountEntry> FuseMountAt(const std::string& path) {
  std::optional<MountEntry> found;
  for (MountEntry& m : ReadMounts())
    if (m.mountpoint == path && m.fstype.rfind("fuse", 0) == 0) found = std::move(m);
  return found;
}

}  // namespace ckptfs
