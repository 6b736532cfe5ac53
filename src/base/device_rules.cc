#include "src/base/device_rules.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/base/device.h"
#include "src/base/log.h"

namespace zinf {
namespace {

thread_local const Stream* t_callback_stream = nullptr;

// -1: not overridden; else the DeviceRuleAction.
std::atomic<int> g_override{-1};

DeviceRuleAction DefaultAction() {
  const char* env = std::getenv("ZINF_DEVICE_RULES");
  if (env != nullptr && std::strcmp(env, "abort") == 0) return DeviceRuleAction::kAbort;
  if (env != nullptr && std::strcmp(env, "error") == 0) return DeviceRuleAction::kError;
#ifdef NDEBUG
  return DeviceRuleAction::kError;
#else
  return DeviceRuleAction::kAbort;
#endif
}

}  // namespace

DeviceRuleAction CurrentDeviceRuleAction() {
  const int o = g_override.load();
  if (o >= 0) return static_cast<DeviceRuleAction>(o);
  static const DeviceRuleAction from_env = DefaultAction();
  return from_env;
}

void SetDeviceRuleAction(DeviceRuleAction action) { g_override.store(static_cast<int>(action)); }

Status DeviceRuleViolation(const std::string& message) {
  if (CurrentDeviceRuleAction() == DeviceRuleAction::kAbort) {
    Log().flush();
    // Straight to stderr: the logger may be off, and the message is all a test's log shows.
    std::fprintf(stderr, "zinf: device rule broken (aborting): %s\n", message.c_str());
    std::fflush(stderr);
    std::abort();
  }
  Log().error("device rule broken: {}", message);
  return FailedPrecondition("device rule broken: " + message);
}

StreamCallbackScope::StreamCallbackScope(const Stream* stream) : previous_(t_callback_stream) {
  t_callback_stream = stream;
}

StreamCallbackScope::~StreamCallbackScope() { t_callback_stream = previous_; }

const Stream* CurrentCallbackStream() { return t_callback_stream; }

Status CheckNotInStreamCallback(const char* op) {
  const Stream* s = t_callback_stream;
  if (s == nullptr) return Status::Ok();
  return DeviceRuleViolation(
      std::string(op) + " called from work running on stream '" + s->name() +
      "' (a Launch function or a completion callback): CUDA forbids any device call there "
      "(cudaLaunchHostFunc), and a synchronizing one would deadlock the stream on a GPU; move "
      "the call to an ordinary thread");
}

}  // namespace zinf
