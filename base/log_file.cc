#include "base/log_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

namespace ckptfs {
namespace {

std::string Octal(mode_t m) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(m & 07777));
  return buf;
}

Status AppendAll(int fd, std::string_view bytes) {
  while (!bytes.empty()) {
    const ssize_t n = ::write(fd, bytes.data(), bytes.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return Status::FromErrno("write");
    bytes.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

}  // namespace

Status CheckOwnFile(int fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return Status::FromErrno("fstat " + path);
  const std::string refuse = "refusing to write to " + path + ": ";
  if (!S_ISREG(st.st_mode)) return Status::Error(EPERM, refuse + "not a regular file");
  if (st.st_uid != ::geteuid()) {
    return Status::Error(EPERM, refuse + "owned by uid " + std::to_string(st.st_uid) + ", not by this daemon's uid " +
                                    std::to_string(::geteuid()) + "; remove it, or give a path nobody else can write");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return Status::Error(
        EPERM, refuse + "mode " + Octal(st.st_mode) + " lets others write it; chmod go-w it, or give another path");
  }
  if (st.st_nlink != 1) {
    return Status::Error(EPERM, refuse + "it has " + std::to_string(st.st_nlink) +
                                    " hard links (another name may be a file it must not touch)");
  }
  return Status::Ok();
}

Result<UniqueFd> OpenOwnFileForAppend(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600));
  if (!fd.valid()) {
    if (errno == ELOOP) {
      return Status::Error(
          ELOOP, "refusing to write to " + path + ": it is a symlink (whoever made it would choose the file written)");
    }
    return Status::FromErrno("cannot open " + path);
  }
  RETURN_IF_ERROR(CheckOwnFile(fd.get(), path));
  return fd;
}

Result<LogFile> LogFile::Open(std::string path, LogFileOptions opts) {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenOwnFileForAppend(path));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("fstat " + path);
  return LogFile(std::move(path), opts, std::move(fd), static_cast<uint64_t>(st.st_size));
}

bool LogFile::NeedsRotation(size_t line_bytes) {
  if (opts_.max_bytes == 0 || size_ + line_bytes <= opts_.max_bytes) return false;
  // Someone (logrotate's copytruncate) may have emptied the file meanwhile.
  struct stat st {};
  if (::fstat(fd_.get(), &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
  return size_ > 0 && size_ + line_bytes > opts_.max_bytes;
}

Status LogFile::Rotate() {
  fd_.reset();
  // rename(2) moves names and never follows a symlink, whatever sits there.
  for (int i = opts_.keep; i >= 1; --i) {
    const std::string from = i == 1 ? path_ : path_ + "." + std::to_string(i - 1);
    const std::string to = path_ + "." + std::to_string(i);
    if (::rename(from.c_str(), to.c_str()) != 0 && errno != ENOENT) {
      return Status::FromErrno("rotating the log: rename " + from + " to " + to);
    }
  }
  if (opts_.keep == 0 && ::unlink(path_.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno("rotating the log: unlink " + path_);
  }
  ASSIGN_OR_RETURN(fd_, OpenOwnFileForAppend(path_));
  size_ = 0;
  return Status::Ok();
}

Status LogFile::Write(std::string_view line) {
  if (fd_.valid() && NeedsRotation(line.size())) {
    if (Status s = Rotate(); !s.ok()) {
      return s.WithContext("the log stops until it can be reopened (SIGHUP)");
    }
  }
  if (!fd_.valid()) return Status::Ok();  // rotation failed before: said so then
  RETURN_IF_ERROR(AppendAll(fd_.get(), line));
  size_ += line.size();
  return Status::Ok();
}

Status LogFile::Reopen() {
  ASSIGN_OR_RETURN(UniqueFd fd, OpenOwnFileForAppend(path_));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno("fstat " + path_);
  fd_ = std::move(fd);
  size_ = static_cast<uint64_t>(st.st_size);
  return Status::Ok();
}

}  // namespace ckptfs
