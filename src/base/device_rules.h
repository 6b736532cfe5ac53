// src/base/device_rules.h — the rules CUDA imposes on a device's users, reported alike on every
// device, so that code which would hang or corrupt memory on a GPU fails on a CPU first.
//
// Contract:
// - A broken rule (a device call from a stream callback, a free of memory that unfinished work
//   still uses, a device-wide synchronization that cannot end) is reported by
//   DeviceRuleViolation(message): the message is logged at error level, then the process aborts
//   when the action is kAbort, else the call fails with FailedPrecondition carrying the message.
//   kAbort in debug builds (NDEBUG undefined) and whenever ZINF_DEVICE_RULES=abort (the test
//   suite sets it); kError in release builds; ZINF_DEVICE_RULES=error forces kError.
//   SetDeviceRuleAction overrides all of these (the tests of the rules themselves).
// - StreamCallbackScope marks the calling thread as running a stream's work: HostDevice's
//   stream worker threads for their whole life, CudaDevice's host functions while they run
//   (cudaLaunchHostFunc: "the host function must not make any CUDA API calls"). Every Device
//   method that reaches the device (memory, streams, copies, launches, events,
//   synchronization) refuses to run under such a scope. Bookkeeping (sub-allocating an arena,
//   reading stats) is allowed.
//
// This header is compiled by nvcc too (C++17): keep it free of C++20 and of CUDA types.
//
// Thread-safety: every function may be called from any thread; the scope is per thread.
#pragma once

#include <string>

#include "zinf/status.h"

namespace zinf {

class Stream;

enum class DeviceRuleAction { kError, kAbort };

DeviceRuleAction CurrentDeviceRuleAction();
void SetDeviceRuleAction(DeviceRuleAction action);

// Logs `message`, then aborts (kAbort) or returns FailedPrecondition(message) (kError).
Status DeviceRuleViolation(const std::string& message);

class StreamCallbackScope {
 public:
  explicit StreamCallbackScope(const Stream* stream);
  ~StreamCallbackScope();
  StreamCallbackScope(const StreamCallbackScope&) = delete;
  StreamCallbackScope& operator=(const StreamCallbackScope&) = delete;

 private:
  const Stream* previous_;
};

// The stream whose work the calling thread runs, or nullptr.
const Stream* CurrentCallbackStream();

// OK, or the violation of calling `op` from a stream callback (names the op and the stream).
Status CheckNotInStreamCallback(const char* op);

}  // namespace zinf
