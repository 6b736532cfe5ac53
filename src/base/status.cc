#include "zinf/status.h"

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

namespace zinf {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kAlreadyExists: return "AlreadyExists";
    case StatusCode::kPermissionDenied: return "PermissionDenied";
    case StatusCode::kResourceExhausted: return "ResourceExhausted";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kOutOfRange: return "OutOfRange";
    case StatusCode::kUnimplemented: return "Unimplemented";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kIoError: return "IoError";
    case StatusCode::kDataLoss: return "DataLoss";
    case StatusCode::kAborted: return "Aborted";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status::Status(StatusCode code, std::string message, int errno_value) {
  if (code != StatusCode::kOk) {
    rep_ = std::make_shared<const Rep>(Rep{code, errno_value, std::move(message)});
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->message : kEmpty;
}

static StatusCode CodeForErrno(int e) {
  switch (e) {
    case EINVAL: case EBADF: case ENAMETOOLONG: case ENOTDIR: case EISDIR: case EFAULT:
      return StatusCode::kInvalidArgument;
    case ENOENT: return StatusCode::kNotFound;
    case EEXIST: return StatusCode::kAlreadyExists;
    case EACCES: case EROFS: return StatusCode::kPermissionDenied;
    case EPERM: return StatusCode::kUnavailable;  // io_uring_setup refused by policy, seccomp
    case ENOSPC: case ENOMEM: case EDQUOT: case EMFILE: case ENFILE: case EFBIG:
      return StatusCode::kResourceExhausted;
    case ELOOP: return StatusCode::kFailedPrecondition;  // a symlink where O_NOFOLLOW forbids
    case ENOSYS: case EOPNOTSUPP: return StatusCode::kUnimplemented;
    case EAGAIN: case EINTR: case EBUSY: return StatusCode::kUnavailable;
    case ECANCELED: return StatusCode::kAborted;
    case EIO: case ENXIO: case ENODEV: default: return StatusCode::kIoError;
  }
}

Status Status::FromErrno(int errno_value, std::string_view context) {
  return Status(CodeForErrno(errno_value),
                fmt::format("{}: {} (errno {})", context, std::strerror(errno_value),
                            errno_value),
                errno_value);
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return fmt::format("{}: {}", StatusCodeName(code()), message());
}

Status Status::WithContext(std::string_view prefix) const {
  if (ok()) return *this;
  return Status(code(), fmt::format("{}: {}", prefix, message()), errno_value());
}

}  // namespace zinf
