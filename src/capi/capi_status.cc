#include "src/capi/capi_status.h"

#include <cstdlib>

#include <fmt/format.h>

#include "src/base/hash.h"
#include "src/base/log.h"

#include "zinf/zinf.h"

namespace zinf::capi {
namespace {

static_assert(-static_cast<int>(StatusCode::kInvalidArgument) == ZINF_E_INVALID_ARGUMENT);
static_assert(-static_cast<int>(StatusCode::kOutOfRange) == ZINF_E_OUT_OF_RANGE);
static_assert(-static_cast<int>(StatusCode::kIoError) == ZINF_E_IO);
static_assert(-static_cast<int>(StatusCode::kInternal) == ZINF_E_INTERNAL);

thread_local std::string last_error;

// A library says less than the zinf command: warnings and errors only, unless ZINF_LOG_LEVEL
// asks for more (set when the library is loaded).
const bool kQuietByDefault = [] {
  if (std::getenv("ZINF_LOG_LEVEL") == nullptr) SetLogLevel("warn");
  return true;
}();

}  // namespace

int Report(const Status& s) {
  if (s.ok()) return ZINF_OK;
  last_error = s.ToString();
  // The C codes are the StatusCode values negated (include/zinf/zinf.h lists them in order).
  return -static_cast<int>(s.code());
}

const char* LastError() { return last_error.c_str(); }

Status CheckSized(const void* p, uint64_t size, uint64_t minimum, const char* what) {
  if (p == nullptr) return InvalidArgument(fmt::format("{}: NULL", what));
  if (size < minimum) {
    return InvalidArgument(fmt::format(
        "{}: size {} is below this struct's first version ({} bytes): set it from the "
        "header's initializer", what, size, minimum));
  }
  return Status::Ok();
}

}  // namespace zinf::capi

extern "C" {

ZINF_API const char* zinf_version(void) { return ZINF_VERSION; }

ZINF_API uint64_t zinf_xxh64(const void* data, uint64_t bytes) {
  return bytes == 0 || data != nullptr ? zinf::Xxh64(data, bytes) : 0;
}

ZINF_API int zinf_version_number(void) { return ZINF_VERSION_NUMBER; }

ZINF_API const char* zinf_strerror(int status) {
  switch (status) {
    case ZINF_OK: return "ok";
    case ZINF_E_INVALID_ARGUMENT: return "invalid argument";
    case ZINF_E_NOT_FOUND: return "not found";
    case ZINF_E_ALREADY_EXISTS: return "already exists";
    case ZINF_E_PERMISSION_DENIED: return "permission denied";
    case ZINF_E_RESOURCE_EXHAUSTED: return "resource exhausted";
    case ZINF_E_FAILED_PRECONDITION: return "failed precondition";
    case ZINF_E_OUT_OF_RANGE: return "out of range";
    case ZINF_E_UNIMPLEMENTED: return "unimplemented";
    case ZINF_E_UNAVAILABLE: return "unavailable";
    case ZINF_E_IO: return "I/O error";
    case ZINF_E_DATA_LOSS: return "data loss";
    case ZINF_E_ABORTED: return "aborted";
    case ZINF_E_INTERNAL: return "internal error";
    default: return "unknown status";
  }
}

ZINF_API const char* zinf_last_error(void) { return zinf::capi::LastError(); }

}  // extern "C"
