// Linked into every test executable: a broken device rule (src/base/device_rules.h) aborts, in
// the test process and in every zinf it starts (the CLI tests), whatever the build type, so the
// suite cannot pass over code that would hang or corrupt memory on a GPU.
#include <cstdlib>

namespace {

// Read by CurrentDeviceRuleAction on first use, after static initialization. An explicit
// ZINF_DEVICE_RULES in the environment is kept.
const bool kStrict = [] { return ::setenv("ZINF_DEVICE_RULES", "abort", /*overwrite=*/0) == 0; }();

}  // namespace
