// src/capi/capi_status.h — the C ABI's error convention (include/zinf/zinf.h): a Status turned
// into a negative ZINF_E_* code with the calling thread's last-error message, and a guard that
// turns every C++ exception into a status, so that none crosses the ABI.
//
// Thread-safety: the last-error message is per thread.
#pragma once

#include <exception>
#include <new>
#include <string>

#include "zinf/status.h"

namespace zinf::capi {

// Records s's message as this thread's last error and returns its code (ZINF_OK for OK).
int Report(const Status& s);
const char* LastError();

// Runs f (returning a Status) and reports its result; exceptions become ZINF_E_RESOURCE_EXHAUSTED
// (bad_alloc) or ZINF_E_INTERNAL, with `call` naming the entry point.
template <typename F>
int Guard(const char* call, F&& f) {
  try {
    return Report(f());
  } catch (const std::bad_alloc&) {
    return Report(ResourceExhausted(std::string(call) + ": out of memory"));
  } catch (const std::exception& e) {
    return Report(Internal(std::string(call) + ": " + e.what()));
  } catch (...) {
    return Report(Internal(std::string(call) + ": unknown exception"));
  }
}

// A size-prefixed struct given by the caller: refused when null or smaller than `minimum`.
Status CheckSized(const void* p, uint64_t size, uint64_t minimum, const char* what);

}  // namespace zinf::capi
