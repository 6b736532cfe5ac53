// CudaDevice through the Device seam (label gpu): skips where no GPU answers; in a build
// without CUDA it checks that asking for the CUDA device says so.
#include <gtest/gtest.h>

#include <cstring>
#include <future>
#include <random>

#include "src/base/cuda_probe.h"
#include "src/base/device.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::unique_ptr<Device> MakeCudaOrSkip(uint64_t budget) {
  DeviceOptions o;
  o.kind = DeviceKind::kCuda;
  o.budget_bytes = budget;
  auto d = MakeCudaDevice(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

class CudaDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CudaProbe p = ProbeCuda();
    if (!p.built_with_cuda) GTEST_SKIP() << "built without CUDA";
    if (p.device_count == 0) GTEST_SKIP() << "no GPU answers: " << p.detail;
  }
};

TEST(CudaDeviceFactoryTest, SaysWhyThereIsNoCudaDevice) {
  CudaProbe p = ProbeCuda();
  if (p.device_count > 0) GTEST_SKIP() << "a GPU answers";
  DeviceOptions o;
  o.budget_bytes = kMiB;
  auto d = MakeCudaDevice(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(),
            p.built_with_cuda ? StatusCode::kUnavailable : StatusCode::kUnimplemented)
      << d.status().ToString();
}

TEST_F(CudaDeviceTest, RoundTripIsByteExact) {
  constexpr uint64_t kBytes = 64 * kMiB + 123;
  auto d = MakeCudaOrSkip(2 * kBytes + kMiB);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->kind(), DeviceKind::kCuda);
  auto* src = static_cast<unsigned char*>(*d->AllocatePinned(kBytes));
  auto* dst = static_cast<unsigned char*>(*d->AllocatePinned(kBytes));
  testing::FillRandom(src, kBytes, 42);
  void* a = *d->Allocate(kBytes);
  void* b = *d->Allocate(kBytes);
  Stream* up = *d->CreateStream("h2d");
  Stream* down = *d->CreateStream("d2h");
  EXPECT_NE(up->NativeHandle(), nullptr);
  ASSERT_TRUE(d->CopyToDevice(up, a, src, kBytes).ok());
  ASSERT_TRUE(d->CopyOnDevice(up, b, a, kBytes).ok());
  auto landed = d->Record(up);
  ASSERT_TRUE(landed.ok()) << landed.status().ToString();
  ASSERT_TRUE(d->StreamWaitEvent(down, *landed).ok());
  ASSERT_TRUE(d->CopyToHost(down, dst, b, kBytes).ok());
  ASSERT_TRUE(d->StreamSynchronize(down).ok());
  EXPECT_TRUE(*d->EventQuery(*landed));
  EXPECT_EQ(std::memcmp(src, dst, kBytes), 0);
  EXPECT_EQ(up->stats().h2d_bytes, kBytes);
  EXPECT_EQ(down->stats().d2h_bytes, kBytes);
  EXPECT_FALSE(d->Allocate(2 * kMiB).ok());  // over the budget
  ASSERT_TRUE(d->Free(a).ok());
  ASSERT_TRUE(d->Free(b).ok());
  ASSERT_TRUE(d->FreePinned(src).ok());
  ASSERT_TRUE(d->FreePinned(dst).ok());
}

TEST_F(CudaDeviceTest, LaunchRunsInOrderAndFailuresAreSticky) {
  auto d = MakeCudaOrSkip(kMiB);
  ASSERT_NE(d, nullptr);
  Stream* s = *d->CreateStream("host-fns");
  Stream* w = *d->CreateStream("waiter");
  std::vector<int> order;
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  ASSERT_TRUE(d->Launch(s, [opened] {
                 opened.wait();
                 return Status::Ok();
               }).ok());
  auto gated = d->Record(s);
  ASSERT_TRUE(gated.ok());
  EXPECT_FALSE(*d->EventQuery(*gated));
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(d->Launch(s, [&order, i] {
                   order.push_back(i);
                   return Status::Ok();
                 }).ok());
  }
  gate.set_value();
  ASSERT_TRUE(d->StreamSynchronize(s).ok());
  ASSERT_EQ(order.size(), 10u);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(order[i], i);

  ASSERT_TRUE(d->Launch(s, [] { return Internal("boom"); }).ok());
  auto after = d->Record(s);
  ASSERT_TRUE(after.ok());
  ASSERT_TRUE(d->StreamWaitEvent(w, *after).ok());
  Status sync = d->StreamSynchronize(s);
  EXPECT_EQ(sync.code(), StatusCode::kInternal) << sync.ToString();
  EXPECT_EQ(d->EventSynchronize(*after).code(), StatusCode::kInternal);
  EXPECT_TRUE(d->EventSynchronize(*gated).ok());
  EXPECT_EQ(d->StreamSynchronize(w).code(), StatusCode::kAborted);
}

TEST_F(CudaDeviceTest, BudgetLargerThanTheGpuIsRefusedAtStart) {
  DeviceOptions o;
  o.budget_bytes = uint64_t{1} << 50;  // 1 PiB
  auto d = MakeCudaDevice(o);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(d.status().message().find("free"), std::string::npos) << d.status().ToString();
}

}  // namespace
}  // namespace zinf
