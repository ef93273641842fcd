// Status and Result<T>: how errors travel through ckptfs.
// A Status carries an errno-style code (what FUSE replies with) and a
// message a user can act on (what gets logged or printed).
#pragma once

#include <cerrno>
#include <string>
#include <utility>
#include <variant>

namespace ckptfs {

class Status {
 public:
  Status() = default;
  static Status Ok() { return Status(); }
  static Status Error(int err, std::string msg) { return Status(err == 0 ? EIO : err, std::move(msg)); }
  // Builds an error from errno at the call site: "what: strerror".
  static Status FromErrno(std::string what);
  static Status FromErrno(int err, std::string what);
  static Status Corruption(std::string msg) { return Status(EIO, "corruption: " + std::move(msg)); }
  static Status InvalidArgument(std::string msg) { return Status(EINVAL, std::move(msg)); }

  bool ok() const { return code_ == 0; }
  int code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string ToString() const;

  // Prefixes context, keeping the code: "reading pack x: short read".
  Status WithContext(const std::string& ctx) const;

 private:
  Status(int code, std::string msg) : code_(code), message_(std::move(msg)) {}
  int code_ = 0;
  std::string message_;
};

template <typename T>
class Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status s) : v_(std::move(s)) {}     // NOLINT: implicit by design

  bool ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return ok(); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ckptfs

#define CKPT_CONCAT_INNER(a, b) a##b
#define CKPT_CONCAT(a, b) CKPT_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function if `expr` failed.
#define RETURN_IF_ERROR(expr)      \
  do {                             \
    ::ckptfs::Status _st = (expr); \
    if (!_st.ok()) return _st;     \
  } while (0)

// auto x = ...Result<T>...; returns its Status on failure.
#define ASSIGN_OR_RETURN(lhs, expr) ASSIGN_OR_RETURN_IMPL(CKPT_CONCAT(_res_, __LINE__), lhs, expr)
#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
