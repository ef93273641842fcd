#include "mount-tools/tree_copy.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/unique_fd.h"

namespace ckptfs {
namespace {

constexpr size_t kCopyBuffer = 1 << 20;

struct Entry {
  std::string name;
  struct stat st;
};

Result<struct stat> Lstat(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return Status::FromErrno("cannot stat " + path);
  return st;
}

// The entries of `dir`, oldest mtime first, then by name.
Result<std::vector<Entry>> EntriesByAge(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return Status::FromErrno("cannot list " + dir);
  std::vector<Entry> out;
  while (const dirent* e = ::readdir(d)) {
    if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
    auto st = Lstat(dir + "/" + e->d_name);
    if (!st.ok()) {
      ::closedir(d);
      return st.status();
    }
    out.push_back({e->d_name, *st});
  }
  ::closedir(d);
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    const auto ta = std::make_pair(a.st.st_mtim.tv_sec, a.st.st_mtim.tv_nsec);
    const auto tb = std::make_pair(b.st.st_mtim.tv_sec, b.st.st_mtim.tv_nsec);
    return ta != tb ? ta < tb : a.name < b.name;
  });
  return out;
}

Status WriteAll(int fd, const uint8_t* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return Status::FromErrno("cannot write " + path);
    p += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

Status SetTimes(const std::string& path, const struct stat& st, int flags = 0) {
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  if (::utimensat(AT_FDCWD, path.c_str(), times, flags) != 0) return Status::FromErrno("cannot set times of " + path);
  return Status::Ok();
}

Status CopyFile(const std::string& from, const std::string& to, const struct stat& st, Progress* progress) {
  UniqueFd in(::open(from.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in.valid()) return Status::FromErrno("cannot open " + from);
  UniqueFd out(::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, st.st_mode & 07777));
  if (!out.valid()) return Status::FromErrno("cannot create " + to);
  std::vector<uint8_t> buf(kCopyBuffer);
  for (;;) {
    const ssize_t n = ::read(in.get(), buf.data(), buf.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Status::FromErrno("cannot read " + from);
    if (n == 0) break;
    RETURN_IF_ERROR(WriteAll(out.get(), buf.data(), static_cast<size_t>(n), to));
    progress->Add(static_cast<uint64_t>(n));
  }
  // close() is where a mount reports a failed write; it must be seen.
  if (::close(out.release()) != 0) return Status::FromErrno("cannot write " + to);
  return SetTimes(to, st);
}

Status CopySymlink(const std::string& from, const std::string& to, const struct stat& st) {
  std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
  const ssize_t n = ::readlink(from.c_str(), target.data(), target.size());
  if (n < 0) return Status::FromErrno("cannot read link " + from);
  target.resize(static_cast<size_t>(n));
  if (::symlink(target.c_str(), to.c_str()) != 0) return Status::FromErrno("cannot create link " + to);
  return SetTimes(to, st, AT_SYMLINK_NOFOLLOW);
}

Status CopyEntry(const std::string& from, const std::string& to, const struct stat& st, Progress* progress,
                 CopyTotals* totals);

Status CopyDirectory(const std::string& from, const std::string& to, const struct stat& st, Progress* progress,
                     CopyTotals* totals) {
  if (::mkdir(to.c_str(), 0700) != 0 && errno != EEXIST) return Status::FromErrno("cannot create " + to);
  ASSIGN_OR_RETURN(std::vector<Entry> entries, EntriesByAge(from));
  for (const Entry& e : entries) RETURN_IF_ERROR(CopyEntry(from + "/" + e.name, to + "/" + e.name, e.st, progress, totals));
  if (::chmod(to.c_str(), st.st_mode & 07777) != 0) return Status::FromErrno("cannot chmod " + to);
  ++totals->directories;
  return SetTimes(to, st);
}

Status CopyEntry(const std::string& from, const std::string& to, const struct stat& st, Progress* progress,
                 CopyTotals* totals) {
  if (S_ISDIR(st.st_mode)) return CopyDirectory(from, to, st, progress, totals);
  if (S_ISREG(st.st_mode)) {
    RETURN_IF_ERROR(CopyFile(from, to, st, progress));
    ++totals->files;
    totals->bytes += static_cast<uint64_t>(st.st_size);
    return Status::Ok();
  }
  if (S_ISLNK(st.st_mode)) {
    ++totals->symlinks;
    return CopySymlink(from, to, st);
  }
  ++totals->skipped;
  return Status::Ok();
}

Status CheckDestination(const std::string& to, bool source_is_dir) {
  struct stat st {};
  if (::lstat(to.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::FromErrno("cannot stat " + to);
  }
  if (!source_is_dir || !S_ISDIR(st.st_mode))
    return Status::Error(EEXIST, to + " exists; name a new path (or an empty directory)");
  DIR* d = ::opendir(to.c_str());
  if (d == nullptr) return Status::FromErrno("cannot list " + to);
  bool empty = true;
  while (const dirent* e = ::readdir(d))
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
  ::closedir(d);
  if (!empty) return Status::Error(ENOTEMPTY, to + " is not empty; name a new or an empty directory");
  return Status::Ok();
}

Status SumBytes(const std::string& path, const struct stat& st, uint64_t* sum) {
  if (S_ISREG(st.st_mode)) *sum += static_cast<uint64_t>(st.st_size);
  if (!S_ISDIR(st.st_mode)) return Status::Ok();
  ASSIGN_OR_RETURN(std::vector<Entry> entries, EntriesByAge(path));
  for (const Entry& e : entries) RETURN_IF_ERROR(SumBytes(path + "/" + e.name, e.st, sum));
  return Status::Ok();
}

}  // namespace

Result<uint64_t> TreeBytes(const std::string& root) {
  ASSIGN_OR_RETURN(struct stat st, Lstat(root));
  uint64_t sum = 0;
  RETURN_IF_ERROR(SumBytes(root, st, &sum));
  return sum;
}

Status CopyTree(const std::string& from, const std::string& to, Progress* progress, CopyTotals* totals) {
  ASSIGN_OR_RETURN(struct stat st, Lstat(from));
  RETURN_IF_ERROR(CheckDestination(to, S_ISDIR(st.st_mode)));
  return CopyEntry(from, to, st, progress, totals);
}

}  // namespace ckptfs
