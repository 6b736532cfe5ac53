// CUDA's rules as the host device enforces them (src/base/device_rules.h): no device call from a
// stream's own work, no free of memory an unfinished copy uses, Allocate/Free synchronizing the
// whole device (a lock held across them that a callback needs is reported as the deadlock it
// would be). Each rule is shown firing on code that breaks it, in both actions: an error
// (release builds) and an abort (debug builds and the test suite).
#include "src/base/device_rules.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "src/base/device.h"

namespace zinf {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kMiB = 1 << 20;

// Sets the action for one test and restores what the environment said.
class RuleAction {
 public:
  explicit RuleAction(DeviceRuleAction a) : before_(CurrentDeviceRuleAction()) {
    SetDeviceRuleAction(a);
  }
  ~RuleAction() { SetDeviceRuleAction(before_); }

 private:
  DeviceRuleAction before_;
};

std::unique_ptr<Device> MakeHost(double copy_gbps = 0, double sync_timeout = 60) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.budget_bytes = 64 * kMiB;
  o.copy_gbps = copy_gbps;
  o.host_sync_timeout_seconds = sync_timeout;
  auto d = MakeHostDevice(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

bool Mentions(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(DeviceRulesTest, ADeviceCallFromALaunchFunctionFails) {
  RuleAction action(DeviceRuleAction::kError);
  auto d = MakeHost();
  auto s = d->CreateStream("compute");
  ASSERT_TRUE(s.ok());
  void* dev = *d->Allocate(kMiB);
  void* host = *d->AllocatePinned(kMiB);
  Status inside_free, inside_copy, inside_sync, inside_alloc;
  ASSERT_TRUE(d->Launch(*s, [&] {
    inside_free = d->Free(dev);
    inside_copy = d->CopyToDevice(*s, dev, host, kMiB);
    inside_sync = d->StreamSynchronize(*s);
    inside_alloc = d->Allocate(4096).status();
    return Status::Ok();
  }).ok());
  ASSERT_TRUE(d->StreamSynchronize(*s).ok());
  for (const Status* st : {&inside_free, &inside_copy, &inside_sync, &inside_alloc}) {
    EXPECT_EQ(st->code(), StatusCode::kFailedPrecondition) << st->ToString();
    EXPECT_TRUE(Mentions(*st, "stream 'compute'")) << st->ToString();
  }
  EXPECT_TRUE(Mentions(inside_free, "device Free")) << inside_free.ToString();
  // Nothing was freed: the memory is still the caller's.
  EXPECT_TRUE(d->IsDeviceMemory(dev, kMiB));
  ASSERT_TRUE(d->Free(dev).ok());
  ASSERT_TRUE(d->FreePinned(host).ok());
}

TEST(DeviceRulesTest, ADeviceCallFromALaunchFunctionAbortsUnderTheStrictAction) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        SetDeviceRuleAction(DeviceRuleAction::kAbort);
        auto d = MakeHost();
        Stream* s = *d->CreateStream("h2d");
        void* dev = *d->Allocate(kMiB);
        (void)d->Launch(s, [&] { return d->Free(dev); });
        (void)d->StreamSynchronize(s);
      },
      "device rule broken.*device Free called from work running on stream 'h2d'");
}

TEST(DeviceRulesTest, FreeingMemoryThatAnUnfinishedCopyUsesIsRefused) {
  RuleAction action(DeviceRuleAction::kError);
  auto d = MakeHost(/*copy_gbps=*/0.02);  // 4 MiB take ~0.2 s
  Stream* s = *d->CreateStream("h2d");
  void* dev = *d->Allocate(4 * kMiB);
  void* host = *d->AllocatePinned(4 * kMiB);
  ASSERT_TRUE(d->CopyToDevice(s, dev, host, 4 * kMiB).ok());
  Status free_dev = d->Free(dev);
  Status free_host = d->FreePinned(host);
  Status idle = d->CheckIdle(static_cast<char*>(dev) + kMiB, 4096, "slot reuse");
  EXPECT_EQ(free_dev.code(), StatusCode::kFailedPrecondition) << free_dev.ToString();
  EXPECT_TRUE(Mentions(free_dev, "copy h2d of 4194304 bytes")) << free_dev.ToString();
  EXPECT_TRUE(Mentions(free_dev, "stream 'h2d'")) << free_dev.ToString();
  EXPECT_EQ(free_host.code(), StatusCode::kFailedPrecondition) << free_host.ToString();
  EXPECT_EQ(idle.code(), StatusCode::kFailedPrecondition) << idle.ToString();
  EXPECT_TRUE(Mentions(idle, "slot reuse")) << idle.ToString();
  // Once the copy is done the same calls succeed.
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  EXPECT_TRUE(d->CheckIdle(dev, 4 * kMiB, "slot reuse").ok());
  EXPECT_TRUE(d->Free(dev).ok());
  EXPECT_TRUE(d->FreePinned(host).ok());
}

TEST(DeviceRulesTest, FreeWaitsForEveryStreamAsCudaFreeDoes) {
  auto d = MakeHost();
  Stream* a = *d->CreateStream("a");
  Stream* b = *d->CreateStream("b");
  void* dev = *d->Allocate(kMiB);
  std::atomic<bool> a_done{false}, b_done{false};
  ASSERT_TRUE(d->Launch(a, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
    a_done = true;
    return Status::Ok();
  }).ok());
  ASSERT_TRUE(d->Launch(b, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    b_done = true;
    return Status::Ok();
  }).ok());
  // Neither stream touches `dev`, yet Free returns only after both finished their work.
  ASSERT_TRUE(d->Free(dev).ok());
  EXPECT_TRUE(a_done && b_done);
  // Allocate too.
  ASSERT_TRUE(d->Launch(a, [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    a_done = false;
    return Status::Ok();
  }).ok());
  auto p = d->Allocate(kMiB);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(a_done);
  ASSERT_TRUE(d->Free(*p).ok());
}

// The deadlock the review predicted for the tier manager: a thread frees device memory while
// holding a mutex that a stream's completion callback needs. On a GPU cudaFree waits for the
// callback, which waits for the mutex: a hang. The host device reports it instead.
TEST(DeviceRulesTest, ALockHeldAcrossFreeThatACallbackNeedsIsReportedAsADeadlock) {
  RuleAction action(DeviceRuleAction::kError);
  auto d = MakeHost(0, /*sync_timeout=*/0.3);
  Stream* s = *d->CreateStream("h2d");
  void* dev = *d->Allocate(kMiB);
  std::mutex mu;
  std::unique_lock<std::mutex> held(mu);
  ASSERT_TRUE(d->Launch(s, [&] {
    std::lock_guard<std::mutex> l(mu);  // a completion taking the manager's lock
    return Status::Ok();
  }).ok());
  auto t0 = Clock::now();
  Status st = d->Free(dev);
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  held.unlock();  // the callback runs now
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_TRUE(Mentions(st, "stream 'h2d'")) << st.ToString();
  EXPECT_TRUE(Mentions(st, "a Launch function")) << st.ToString();
  EXPECT_TRUE(Mentions(st, "deadlock")) << st.ToString();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 5.0);
  // The refused Free freed nothing; after the callback ran it succeeds.
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  EXPECT_TRUE(d->Free(dev).ok());
}

TEST(DeviceRulesTest, BookkeepingIsAllowedFromACallback) {
  auto d = MakeHost();
  Stream* s = *d->CreateStream("s");
  uint64_t seen = 0;
  bool in_callback = false;
  ASSERT_TRUE(d->Launch(s, [&] {
    seen = d->bytes_in_use() + d->budget_bytes();
    in_callback = CurrentCallbackStream() == s;
    return Status::Ok();
  }).ok());
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  EXPECT_EQ(seen, 64 * kMiB);
  EXPECT_TRUE(in_callback);
  EXPECT_EQ(CurrentCallbackStream(), nullptr);
}

}  // namespace
}  // namespace zinf
