// zinf/status.h — the one error convention of the project.
//
// Contract: every fallible function returns a Status or a Result<T>. Both are [[nodiscard]]:
// ignoring one is a compile warning (an error under -Werror). A Status is either OK (no
// allocation) or carries a code, an optional errno and a message that names what failed
// (the path, offset and length for I/O). errno values are mapped to codes in exactly one place,
// Status::FromErrno.
//
// Thread-safety: Status and Result are values; distinct objects may be used from distinct
// threads freely, one object needs external synchronisation like any value type.
#pragma once

#include <cassert>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace zinf {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,    // bad input: config, flag, misaligned request
  kNotFound,           // missing file or directory
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,  // ENOSPC, ENOMEM, a budget that cannot be met
  kFailedPrecondition, // the world is not in the state the call needs (symlink in the way...)
  kOutOfRange,         // read past the end of a file
  kUnimplemented,      // not supported here (ENOSYS, EOPNOTSUPP)
  kUnavailable,        // refused by the system, may work elsewhere (EPERM on io_uring_setup)
  kIoError,            // EIO and other device errors
  kDataLoss,           // checksum mismatch, truncated file
  kAborted,            // cancelled by the caller or by an earlier failure
  kInternal,           // a bug in zinf
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message, int errno_value = 0);

  static Status Ok() { return Status(); }
  // The one place errno becomes a code. `context` says what was attempted, for example
  // "pwrite /mnt/nvme/zinf.swap offset 4096 length 1048576".
  static Status FromErrno(int errno_value, std::string_view context);

  bool ok() const { return rep_ == nullptr; }
  StatusCode code() const { return rep_ ? rep_->code : StatusCode::kOk; }
  int errno_value() const { return rep_ ? rep_->errno_value : 0; }
  const std::string& message() const;
  // "IoError: pwrite /x offset 0 length 4096: Input/output error (errno 5)"
  std::string ToString() const;

  // Returns a copy whose message is "<prefix>: <old message>", code and errno kept.
  Status WithContext(std::string_view prefix) const;

  // Marks a deliberately ignored status.
  void IgnoreError() const {}

 private:
  struct Rep {
    StatusCode code;
    int errno_value;
    std::string message;
  };
  std::shared_ptr<const Rep> rep_;  // null when OK; shared so copies are cheap
};

inline Status InvalidArgument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
inline Status FailedPrecondition(std::string m) {
  return {StatusCode::kFailedPrecondition, std::move(m)};
}
inline Status ResourceExhausted(std::string m) {
  return {StatusCode::kResourceExhausted, std::move(m)};
}
inline Status Unimplemented(std::string m) { return {StatusCode::kUnimplemented, std::move(m)}; }
inline Status IoError(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
inline Status DataLoss(std::string m) { return {StatusCode::kDataLoss, std::move(m)}; }
inline Status Aborted(std::string m) { return {StatusCode::kAborted, std::move(m)}; }
inline Status Internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }

// Result<T>: a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::Ok() : std::get<Status>(v_); }

  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace zinf

#define ZINF_CONCAT_INNER_(a, b) a##b
#define ZINF_CONCAT_(a, b) ZINF_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if it is not OK.
#define ZINF_RETURN_IF_ERROR(expr)                  \
  do {                                              \
    ::zinf::Status zinf_status_ = (expr);           \
    if (!zinf_status_.ok()) return zinf_status_;    \
  } while (0)

// `ZINF_ASSIGN_OR_RETURN(auto x, MakeX());` — declares x from a Result or returns its status.
#define ZINF_ASSIGN_OR_RETURN(lhs, expr) \
  ZINF_ASSIGN_OR_RETURN_IMPL_(ZINF_CONCAT_(zinf_result_, __LINE__), lhs, expr)
#define ZINF_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
