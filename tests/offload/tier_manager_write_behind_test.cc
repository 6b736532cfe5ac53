// offload::TierManager with write_behind: a host copy of an NVMe-homed shard released dirty is
// written home at once in the background (its later eviction or Flush writes nothing more), and
// a background write that fails leaves the copy dirty and is reported by the next Acquire.
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "io/fault_backend.h"
#include "offload/tier_manager.h"
#include "tests/offload/tier_manager_rig.h"

namespace zinf::offload {
namespace {

using namespace tm_rig;  // NOLINT: the rig's helpers

// Overwrites shard `id`'s host copy with `bytes` and releases it dirty.
void WriteDirty(TierManager& tm, ShardId id, const std::vector<uint8_t>& bytes) {
  auto lease = tm.Acquire(id, Tier::kHost, AcquireMode::kOverwrite);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  auto p = lease->Wait();
  ASSERT_TRUE(p.ok());
  std::memcpy(*p, bytes.data(), bytes.size());
  ASSERT_TRUE(tm.Release(std::move(*lease), true).ok());
}

// What the shard's NVMe home holds: its copies dropped (refused while one is dirty), then read.
std::vector<uint8_t> HomeBytes(TierManager& tm, ShardId id) {
  std::vector<uint8_t> out(kShard);
  EXPECT_TRUE(tm.Invalidate(id).ok());
  EXPECT_TRUE(tm.ReadHome(id, out.data()).ok());
  return out;
}

TEST(TierManagerWriteBehindTest, ADirtyReleaseIsWrittenHomeAtOnceAndFlushWritesNothingMore) {
  for (bool behind : {true, false}) {
    SCOPED_TRACE(behind ? "write_behind" : "write on eviction");
    Rig rig;
    ASSERT_TRUE(rig.Make(8 << 20, 4 << 20, true, 0, behind).ok());
    std::vector<ShardId> ids;
    ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 2, "m", &ids));
    const TierStats base = rig.tm->stats();
    const std::vector<uint8_t> b(kShard, 42);
    ASSERT_NO_FATAL_FAILURE(WriteDirty(*rig.tm, ids[0], b));
    // Without write_behind the copy is dirty until something writes it: Invalidate refuses.
    if (!behind) {
      EXPECT_EQ(rig.tm->Invalidate(ids[0]).code(), StatusCode::kFailedPrecondition);
      ASSERT_TRUE(rig.tm->Flush().ok());
    }
    ASSERT_TRUE(rig.tm->Flush().ok());  // with write_behind: waits for the write in flight
    const TierStats s = rig.tm->stats();
    EXPECT_EQ(s.writebacks - base.writebacks, 1u) << "one write home, not two";
    EXPECT_EQ(s.write_behinds - base.write_behinds, behind ? 1u : 0u);
    EXPECT_EQ(HomeBytes(*rig.tm, ids[0]), b);
    EXPECT_EQ(HomeBytes(*rig.tm, ids[1]), std::vector<uint8_t>(kShard, 1)) << "untouched";
  }
}

TEST(TierManagerWriteBehindTest, AFailedBackgroundWriteStaysDirtyAndTheNextAcquireSaysSo) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20, true, 0, /*write_behind=*/true).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 2, "m", &ids));
  rig.faults->set_rule([](const io::Piece& p) -> io::Fault {
    return p.op == io::OpKind::kWrite ? io::Fault{io::Fault::kErrno, EIO, 0} : io::Fault{};
  });
  const std::vector<uint8_t> b(kShard, 43);
  ASSERT_NO_FATAL_FAILURE(WriteDirty(*rig.tm, ids[0], b));
  // The failure arrives with the write's completion: an Acquire after it returns it, once.
  Status reported;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (reported.ok() && std::chrono::steady_clock::now() < deadline) {
    auto lease = rig.tm->Acquire(ids[1], Tier::kHost);
    if (!lease.ok()) {
      reported = lease.status();
      break;
    }
    ASSERT_TRUE(lease->Wait().ok());
    ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_FALSE(reported.ok()) << "the failed background write was never reported";
  EXPECT_EQ(reported.errno_value(), EIO);
  EXPECT_NE(reported.message().find("m0"), std::string::npos) << reported.message();
  // Nothing was marked clean that was not written: the copy is dirty, and once writes work
  // again Flush takes it home.
  EXPECT_EQ(rig.tm->Invalidate(ids[0]).code(), StatusCode::kFailedPrecondition);
  rig.faults->set_rule(nullptr);
  ASSERT_TRUE(rig.tm->Flush().ok());
  EXPECT_EQ(HomeBytes(*rig.tm, ids[0]), b);
}

}  // namespace
}  // namespace zinf::offload
