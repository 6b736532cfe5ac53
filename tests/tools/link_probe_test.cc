// tools::ProbeLink: it measures the link a device paces, and leaves nothing allocated.
#include "tools/link_probe.h"

#include <gtest/gtest.h>

#include "src/base/host_device.h"

namespace zinf::tools {
namespace {

std::unique_ptr<Device> HostDeviceOf(double copy_gbps, uint64_t budget) {
  DeviceOptions o;
  o.kind = DeviceKind::kHost;
  o.budget_bytes = budget;
  o.copy_gbps = copy_gbps;
  auto d = MakeDevice(o);
  EXPECT_TRUE(d.ok()) << d.status().ToString();
  return d.ok() ? std::move(d).value() : nullptr;
}

// The host-emulated device paced at 0.5 GB/s each way: 4 MiB copies take at least 8.4 ms, and
// the probe reports that rate, not memcpy's (about 10 GB/s here). Pacing books each copy after
// the one before it, so no copy is faster; a loaded machine can only make one slower.
TEST(LinkProbeTest, MeasuresThePacedLinkEachWay) {
  auto dev = HostDeviceOf(0.5, 64ull << 20);
  ASSERT_NE(dev, nullptr);
  auto r = ProbeLink(*dev, 4ull << 20, 3);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LE(r->h2d_gbps, 0.5 * 1.02);
  EXPECT_GT(r->h2d_gbps, 0.1);
  EXPECT_LE(r->d2h_gbps, 0.5 * 1.02);
  EXPECT_GT(r->d2h_gbps, 0.1);
  EXPECT_EQ(dev->bytes_in_use(), 0u);
}

// The buffer is capped at half the device budget (a 4 MiB budget: 2 MiB, 4 ms a copy at 0.5 GB/s).
TEST(LinkProbeTest, StaysWithinTheDeviceBudget) {
  auto dev = HostDeviceOf(0.5, 4ull << 20);
  ASSERT_NE(dev, nullptr);
  auto r = ProbeLink(*dev, 256ull << 20, 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->h2d_gbps, 0);
  EXPECT_LE(r->h2d_gbps, 0.5 * 1.02);
  EXPECT_EQ(dev->bytes_in_use(), 0u);
}

TEST(LinkProbeTest, RefusesNoRepetitionsAndATooSmallBudget) {
  auto dev = HostDeviceOf(0, 4ull << 20);
  ASSERT_NE(dev, nullptr);
  EXPECT_EQ(ProbeLink(*dev, 1 << 20, 0).status().code(), StatusCode::kInvalidArgument);
  auto tiny = HostDeviceOf(0, 1ull << 19);
  ASSERT_NE(tiny, nullptr);
  auto r = ProbeLink(*tiny, 1 << 20, 1);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
}

}  // namespace
}  // namespace zinf::tools
