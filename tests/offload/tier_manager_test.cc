// offload::TierManager over the host-emulated device: budgets never exceeded, data always
// what was last written, dirty copies written home before reuse, no deadlock on tight budgets,
// zero misses on a repeated trace, and failed write-backs that leave the copy dirty.
#include "offload/tier_manager.h"

#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/aligned_buffer.h"
#include "io/fault_backend.h"
#include "tests/offload/tier_manager_rig.h"
#include "tests/test_util.h"

namespace zinf::offload {
namespace {

using zinf::testing::FillRandom;
using namespace tm_rig;  // NOLINT: the rig's helpers, shared with the other tier manager tests

TEST(TierManagerTest, RandomTracesKeepBudgetsAndData) {
  int refused = 0;
  for (uint64_t seed = 1; seed <= 16; ++seed) {
    std::mt19937_64 rng(seed);
    Rig rig;
    const uint64_t dev_budget = (256 + rng() % 512) << 10;
    const uint64_t pin_budget = (512 + rng() % 1024) << 10;
    ASSERT_TRUE(rig.Make(dev_budget, pin_budget).ok());
    const int nshards = 12;
    std::vector<ShardId> ids;
    std::vector<std::vector<uint8_t>> model;
    uint64_t host_homes = 0;
    for (int i = 0; i < nshards; ++i) {
      uint64_t bytes = 1000 + rng() % (std::min(dev_budget, pin_budget) / 3);
      // Some shards live in pinned memory, leaving room to stage the others.
      Tier home = rng() % 5 == 0 && host_homes + bytes < pin_budget / 4 ? Tier::kHost : Tier::kNvme;
      if (home == Tier::kHost) host_homes += bytes + 4096;
      auto id = rig.tm->Register({.name = fmt::format("s{}", i), .unit = static_cast<uint32_t>(i),
                                  .bytes = bytes, .home = home});
      if (!id.ok()) continue;  // a host-homed shard may not fit the pinned budget: refused
      std::vector<uint8_t> content(bytes);
      FillRandom(content.data(), bytes, seed * 100 + i);
      ids.push_back(*id);
      model.push_back(std::move(content));
    }
    ASSERT_GE(ids.size(), 6u);
    // One lease at a time; a plan whose size classes do not fit is refused at start (and
    // counted), never mid-run.
    Status sealed = rig.Seal(1, 1);
    if (!sealed.ok()) {
      ASSERT_EQ(sealed.code(), StatusCode::kResourceExhausted) << sealed.ToString();
      ++refused;
      continue;
    }
    for (size_t k = 0; k < ids.size(); ++k) {
      ASSERT_TRUE(rig.tm->WriteHome(ids[k], model[k].data()).ok());
    }
    // A fixed random trace, replayed for three steps (so prefetch and Belady run too).
    std::vector<std::pair<size_t, Tier>> trace;
    for (int k = 0; k < 60; ++k) {
      trace.push_back({rng() % ids.size(), rng() % 2 ? Tier::kDevice : Tier::kHost});
    }
    for (int step = 0; step < 3; ++step) {
      for (size_t pos = 0; pos < trace.size(); ++pos) {
        auto [k, tier] = trace[pos];
        auto lease = rig.tm->Acquire(ids[k], tier);
        ASSERT_TRUE(lease.ok()) << lease.status().ToString();
        auto p = lease->Wait();
        ASSERT_TRUE(p.ok()) << p.status().ToString();
        ASSERT_TRUE(Bytes(*p, model[k].size()) == model[k]) << "seed " << seed << " shard " << k << " step " << step << " tier " << (tier == Tier::kHost ? "host" : "device") << " pos " << pos;
        bool write = rng() % 3 == 0;
        if (write) {
          FillRandom(*p, model[k].size(), rng());
          model[k] = Bytes(*p, model[k].size());
        }
        ASSERT_TRUE(rig.tm->Release(std::move(*lease), write).ok());
        ASSERT_LE(rig.tm->stats().peak_device_bytes, dev_budget);
        ASSERT_LE(rig.tm->stats().peak_host_bytes, pin_budget);
      }
      rig.tm->EndStep();
    }
    ASSERT_TRUE(rig.tm->Flush().ok());
    for (size_t k = 0; k < ids.size(); ++k) {
      std::vector<uint8_t> home(model[k].size());
      ASSERT_TRUE(rig.tm->ReadHome(ids[k], home.data()).ok());
      EXPECT_EQ(home, model[k]) << "seed " << seed << " shard " << k;
    }
    TierStats st = rig.tm->stats();
    EXPECT_LE(st.peak_device_bytes, dev_budget);
    EXPECT_LE(st.peak_host_bytes, pin_budget);
    EXPECT_GT(st.evictions, 0u) << "budgets too loose for the test to mean anything";
  }
  EXPECT_LE(refused, 8) << "most random plans should fit their budgets";
}

TEST(TierManagerTest, RepeatedTraceWithEnoughBudgetHasNoMissesInStepTwo) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 16 << 20).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 8, "p", &ids));
  auto run_step = [&] {
    for (int pass = 0; pass < 2; ++pass) {  // forward, then backward in reverse
      for (int i = 0; i < 8; ++i) {
        ASSERT_NO_FATAL_FAILURE(Touch(*rig.tm, ids[pass == 0 ? i : 7 - i], Tier::kDevice));
      }
    }
    rig.tm->EndStep();
  };
  run_step();
  TierStats first = rig.tm->stats();
  EXPECT_EQ(first.prefetch_misses, 8u);
  run_step();
  TierStats second = rig.tm->stats();
  EXPECT_EQ(second.prefetch_misses - first.prefetch_misses, 0u);
  EXPECT_EQ(second.prefetch_hits - first.prefetch_hits, 16u);
}

TEST(TierManagerTest, AChangedOrderFallsBackToOnDemandThenRecordsAgain) {
  Rig rig;
  ASSERT_TRUE(rig.Make(3 * (256 << 10), 4 * (256 << 10)).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 8, "o", &ids));
  auto run = [&](const std::vector<int>& order) {
    for (int i : order) {
      auto lease = rig.tm->Acquire(ids[i], Tier::kDevice);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      auto p = lease->Wait();
      ASSERT_TRUE(p.ok());
      ASSERT_EQ(static_cast<uint8_t*>(*p)[77], static_cast<uint8_t>(i));
      ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
    }
    rig.tm->EndStep();
  };
  const std::vector<int> a = {0, 1, 2, 3, 4, 5, 6, 7}, b = {7, 5, 3, 1, 0, 2, 4, 6};
  run(a);
  EXPECT_TRUE(rig.tm->has_trace());
  run(b);  // departs at once: on demand, and the trace is dropped
  EXPECT_FALSE(rig.tm->has_trace());
  run(b);  // recorded
  EXPECT_TRUE(rig.tm->has_trace());
  TierStats before = rig.tm->stats();
  run(b);  // replayed with prefetch
  TierStats after = rig.tm->stats();
  EXPECT_LT(after.prefetch_misses - before.prefetch_misses, 8u);
}

TEST(TierManagerTest, PrefetchReachesOnlyPrefetchUnitsAhead) {
  Rig rig;
  ASSERT_TRUE(rig.Make(16 << 20, 16 << 20).ok());
  rig.tm.reset();
  auto tm = TierManager::Create(*rig.arena, *rig.pool, rig.swap.get(), {.prefetch_units = 1});
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  std::vector<ShardId> ids;
  for (uint32_t u = 0; u < 8; ++u) {
    auto id = (*tm)->Register({.name = fmt::format("u{}", u), .unit = u, .bytes = 256 << 10});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (ShardId id : ids) ASSERT_NO_FATAL_FAILURE(Touch(**tm, id, Tier::kHost));
  for (ShardId id : ids) ASSERT_TRUE((*tm)->Invalidate(id).ok());
  const uint64_t before = (*tm)->stats().nvme_read_bytes;
  (*tm)->EndStep();  // the trace is known: prefetch the first unit only
  ASSERT_NO_FATAL_FAILURE(Touch(**tm, ids[0], Tier::kHost));  // and now the second
  ASSERT_TRUE((*tm)->Flush().ok());  // waits for reads in flight
  EXPECT_EQ((*tm)->stats().nvme_read_bytes - before, 2u * (256 << 10));
}

// EndStep prefetched the next step's first weights even while the optimizer was about to
// rewrite them: reads for nothing, and the optimizer's install then found the copy in transfer.
// Shards marked BeginRewrite are left alone until their new content is known.
TEST(TierManagerTest, PrefetchLeavesShardsAboutToBeRewrittenAlone) {
  Rig rig;
  ASSERT_TRUE(rig.Make(16 << 20, 16 << 20).ok());
  std::vector<ShardId> ids;
  for (uint32_t u = 0; u < 4; ++u) {
    auto id = rig.tm->Register({.name = fmt::format("u{}", u), .unit = u, .bytes = 256 << 10});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  for (ShardId id : ids) ASSERT_NO_FATAL_FAILURE(Touch(*rig.tm, id, Tier::kHost));
  for (ShardId id : ids) ASSERT_TRUE(rig.tm->Invalidate(id).ok());
  rig.tm->BeginRewrite(ids[0]);
  rig.tm->BeginRewrite(ids[1]);
  const uint64_t before = rig.tm->stats().nvme_read_bytes;
  rig.tm->EndStep();                 // the trace is known: prefetch what the next step needs first
  ASSERT_TRUE(rig.tm->Flush().ok());  // waits for reads in flight
  EXPECT_EQ(rig.tm->stats().nvme_read_bytes - before, 2u * (256 << 10))
      << "only u2 and u3: u0 and u1 are about to be rewritten";
  // Once the new content is known (written home here), they are fetched as usual.
  rig.tm->HomeRewritten(ids[0]);
  rig.tm->EndPending(ids[1], false);
  auto installed = rig.tm->InstallPending(ids[0], std::vector<uint8_t>(256 << 10, 7).data());
  ASSERT_TRUE(installed.ok() && *installed);
  rig.tm->HomeRewritten(ids[0]);
  ASSERT_NO_FATAL_FAILURE(Touch(*rig.tm, ids[0], Tier::kHost));
  ASSERT_NO_FATAL_FAILURE(Touch(*rig.tm, ids[1], Tier::kHost));
}

TEST(TierManagerTest, PrefetchHidesFetchesUnderATightBudget) {
  Rig rig;
  // Room for 3 of 10 shards on the device and 4 in pinned memory: each step must stream.
  ASSERT_TRUE(rig.Make(3 * (256 << 10), 4 * (256 << 10)).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 10, "p", &ids));
  auto run_step = [&] {
    for (int i = 0; i < 10; ++i) {
      auto lease = rig.tm->Acquire(ids[i], Tier::kDevice);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      auto p = lease->Wait();
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(static_cast<uint8_t*>(*p)[1000], static_cast<uint8_t>(i));
      ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
    }
    rig.tm->EndStep();
  };
  run_step();
  TierStats first = rig.tm->stats();
  run_step();
  run_step();
  TierStats third = rig.tm->stats();
  // With the trace known, most acquires find their shard already fetched or on its way.
  EXPECT_LT(third.prefetch_misses - first.prefetch_misses, 10u);
  EXPECT_GT(third.prefetch_hits - first.prefetch_hits, 10u);
  EXPECT_LE(third.peak_device_bytes, 3u * (256 << 10));
}

TEST(TierManagerTest, FailedWriteBackLeavesTheCopyDirtyAndReportsIt) {
  Rig rig;
  ASSERT_TRUE(rig.Make(4 << 20, 2 * (256 << 10), /*prefetch=*/false).ok());
  std::vector<ShardId> ids;
  std::vector<uint8_t> old_bytes(256 << 10, 0x11), new_bytes(256 << 10, 0x22);
  for (int i = 0; i < 3; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("g{}", i), .bytes = 256 << 10});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(rig.Seal(1, 2, 0, 0).ok());  // two host slots, both for leases
  for (ShardId id : ids) ASSERT_TRUE(rig.tm->WriteHome(id, old_bytes.data()).ok());
  // Make shard 0 dirty in pinned memory.
  auto l0 = rig.tm->Acquire(ids[0], Tier::kHost);
  ASSERT_TRUE(l0.ok());
  auto p0 = l0->Wait();
  ASSERT_TRUE(p0.ok());
  std::memcpy(*p0, new_bytes.data(), new_bytes.size());
  ASSERT_TRUE(rig.tm->Release(std::move(*l0), true).ok());
  // Every write fails from now on.
  rig.faults->set_rule([](const io::Piece& p) -> io::Fault {
    return p.op == io::OpKind::kWrite ? io::Fault{io::Fault::kErrno, EIO, 0} : io::Fault{};
  });
  // Shards 1 and 2 need the room shard 0 holds: its write-back fails and that error surfaces.
  auto l1 = rig.tm->Acquire(ids[1], Tier::kHost);
  ASSERT_TRUE(l1.ok());
  ASSERT_TRUE(l1->Wait().ok());
  auto l2 = rig.tm->Acquire(ids[2], Tier::kHost);
  ASSERT_FALSE(l2.ok());
  EXPECT_EQ(l2.status().errno_value(), EIO);
  EXPECT_NE(l2.status().message().find("g0"), std::string::npos) << l2.status().message();
  ASSERT_TRUE(rig.tm->Release(std::move(*l1), false).ok());
  // Home still holds the old bytes: nothing was marked clean that was not written.
  std::vector<uint8_t> home(256 << 10);
  ASSERT_TRUE(rig.tm->ReadHome(ids[0], home.data()).ok());
  EXPECT_EQ(home, old_bytes);
  EXPECT_FALSE(rig.tm->Flush().ok());
  // Once writes work again the dirty copy, still resident, reaches home.
  rig.faults->set_rule(nullptr);
  ASSERT_TRUE(rig.tm->Flush().ok());
  ASSERT_TRUE(rig.tm->ReadHome(ids[0], home.data()).ok());
  EXPECT_EQ(home, new_bytes);
}

// A lease beyond what was declared at Seal is refused at once, naming the role and the tier,
// instead of waiting for memory that the plan never set aside for it (the old first-fit pool
// could hang or fail here depending on fragmentation).
TEST(TierManagerTest, AcquiringMoreLeasesThanDeclaredFailsInsteadOfHanging) {
  Rig rig;
  ASSERT_TRUE(rig.Make(2 * (256 << 10), 8 << 20).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 3; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("w{}", i), .bytes = 256 << 10});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  ASSERT_TRUE(rig.Seal(2, 1).ok());
  auto a = rig.tm->Acquire(ids[0], Tier::kDevice);
  auto b = rig.tm->Acquire(ids[1], Tier::kDevice);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = rig.tm->Acquire(ids[2], Tier::kDevice);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("2 lease(s) of role param16"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("device tier"), std::string::npos);
  ASSERT_TRUE(a->Wait().ok());
  ASSERT_TRUE(rig.tm->Release(std::move(*a), false).ok());
  ASSERT_TRUE(rig.tm->Release(std::move(*b), false).ok());
  auto d = rig.tm->Acquire(ids[2], Tier::kDevice);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_TRUE(d->Wait().ok());
  ASSERT_TRUE(rig.tm->Release(std::move(*d), false).ok());
}

// The plan refuses, at Seal, a budget that cannot hold the declared leases of each size class,
// naming what each class needs; a plan that fits is accepted, and MinimumSealBytes says the
// bytes it needs.
TEST(TierManagerTest, SealRefusesAPlanThatCannotHoldTheDeclaredLeases) {
  Rig rig;
  ASSERT_TRUE(rig.Make(2 * kShard, 2 * kShard).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 4; ++i) {
    auto id = rig.tm->Register({.name = fmt::format("w{}", i), .bytes = kShard});
    ASSERT_TRUE(id.ok());
    ids.push_back(*id);
  }
  SealOptions three;
  three.max_leases[0].fill(3);
  EXPECT_EQ(rig.tm->MinimumSealBytes(three).device_bytes, 3 * kShard);
  Status refused = rig.tm->Seal(three);
  EXPECT_EQ(refused.code(), StatusCode::kResourceExhausted) << refused.ToString();
  EXPECT_NE(refused.message().find("device tier"), std::string::npos) << refused.message();
  EXPECT_NE(refused.message().find("3 x 262144 bytes"), std::string::npos) << refused.message();
  EXPECT_FALSE(rig.tm->sealed());
  ASSERT_TRUE(rig.Seal(2, 1).ok()) << "a plan that fits";
  EXPECT_EQ(rig.tm->Seal().code(), StatusCode::kFailedPrecondition) << "sealed once";
  EXPECT_EQ(rig.tm->Register({.name = "late", .bytes = kShard}).status().code(),
            StatusCode::kFailedPrecondition);
}

// Two threads cycling dirty host copies through a pool of three: a copy being written back
// (pinned by its write, not by a lease) is waited for, never reported as leased memory; and
// every read sees what its thread wrote last.
TEST(TierManagerTest, WriteBacksInFlightAreWaitedForNotCountedAsLeases) {
  Rig rig;
  ASSERT_TRUE(rig.Make(2 * kShard, 3 * kShard).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(*rig.tm->Register({.name = fmt::format("s{}", i),
                                                               .bytes = kShard}));
  ASSERT_TRUE(rig.Seal(1, 2).ok());  // a host lease per thread, and one slot in transfer
  ids.clear();
  RegisterFilledSealed(*rig.tm, 8, &ids);
  if (HasFatalFailure()) return;
  std::atomic<int> errors{0};
  auto run = [&](int first) {
    std::vector<uint8_t> last = {uint8_t(first), uint8_t(first + 1), uint8_t(first + 2),
                                 uint8_t(first + 3)};
    std::mt19937 rng(first);
    for (int it = 0; it < 150 && errors == 0; ++it) {
      const int k = static_cast<int>(rng() % 4);
      auto lease = rig.tm->Acquire(ids[first + k], Tier::kHost);
      if (!lease.ok()) {
        ADD_FAILURE() << lease.status().ToString();
        ++errors;
        return;
      }
      auto p = lease->Wait();
      if (!p.ok() || Bytes(*p, kShard) != std::vector<uint8_t>(kShard, last[k])) {
        ADD_FAILURE() << "shard " << first + k << " at iteration " << it;
        ++errors;
      }
      if (p.ok()) {
        last[k] = static_cast<uint8_t>(100 + first + it);
        std::memset(*p, last[k], kShard);
      }
      EXPECT_TRUE(rig.tm->Release(std::move(*lease), true).ok());
    }
  };
  std::thread t1(run, 0), t2(run, 4);
  t1.join();
  t2.join();
  EXPECT_EQ(errors.load(), 0);
}

// A host copy pinned only as the staging of a device copy in flight is not a lease: an
// acquire that needs its memory waits for the copy to end instead of failing.
TEST(TierManagerTest, AStagingCopyInFlightIsWaitedForNotCountedAsALease) {
  Rig rig;
  // One shard of pinned memory; h2d paced at 2.5 MB/s, so a 256 KiB copy takes ~0.1 s.
  ASSERT_TRUE(rig.Make(2 * kShard, kShard, /*prefetch=*/false, /*copy_gbps=*/0.0025).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 2; ++i) ids.push_back(*rig.tm->Register({.name = fmt::format("w{}", i),
                                                               .bytes = kShard}));
  ASSERT_TRUE(rig.Seal(1, 1, 0, 0).ok());  // one host slot: the lease's, or the staging's
  ids.clear();
  RegisterFilledSealed(*rig.tm, 2, &ids);
  if (HasFatalFailure()) return;
  auto on_device = rig.tm->Acquire(ids[0], Tier::kDevice);  // its host copy stages the h2d
  ASSERT_TRUE(on_device.ok()) << on_device.status().ToString();
  auto on_host = rig.tm->Acquire(ids[1], Tier::kHost);
  ASSERT_TRUE(on_host.ok()) << on_host.status().ToString();
  auto h = on_host->Wait();
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(Bytes(*h, kShard), std::vector<uint8_t>(kShard, 1));
  auto d = on_device->Wait();
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(Bytes(*d, kShard), std::vector<uint8_t>(kShard, 0));
  ASSERT_TRUE(rig.tm->Release(std::move(*on_host), false).ok());
  ASSERT_TRUE(rig.tm->Release(std::move(*on_device), false).ok());
}

// InstallPending: new content served from the host tier at once (no NVMe read), held until
// HomeRewritten (an acquire needing its memory waits for that), dropped by EndPending(false),
// refused while a copy is leased.
TEST(TierManagerTest, InstallPendingServesNewContentAndHoldsItUntilTheHomeWrite) {
  Rig rig;
  ASSERT_TRUE(rig.Make(2 * kShard, 2 * kShard, /*prefetch=*/false).ok());
  std::vector<ShardId> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(*rig.tm->Register({.name = fmt::format("w{}", i),
                                                               .bytes = kShard}));
  ASSERT_TRUE(rig.Seal(1, 2, 0, 0).ok());  // two host slots: two leases at once
  ids.clear();
  RegisterFilledSealed(*rig.tm, 3, &ids);
  if (HasFatalFailure()) return;
  Touch(*rig.tm, ids[0], Tier::kDevice);  // old copies in both tiers
  if (HasFatalFailure()) return;
  const std::vector<uint8_t> fresh(kShard, 0xab);
  auto installed = rig.tm->InstallPending(ids[0], fresh.data());
  ASSERT_TRUE(installed.ok() && *installed) << installed.status().ToString();
  EXPECT_EQ(rig.tm->InstallPending(ids[0], fresh.data()).status().code(),
            StatusCode::kFailedPrecondition);
  const uint64_t reads = rig.tm->stats().nvme_read_bytes;
  for (Tier t : {Tier::kHost, Tier::kDevice}) {
    auto lease = rig.tm->Acquire(ids[0], t);
    ASSERT_TRUE(lease.ok());
    auto p = lease->Wait();
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    EXPECT_EQ(Bytes(*p, kShard), fresh) << TierName(t);
    ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
  }
  EXPECT_EQ(rig.tm->stats().nvme_read_bytes, reads) << "served without reading NVMe";
  // Room for two host copies: the held one and shard 1's. Shard 2 needs the held copy's memory,
  // so its acquire waits for HomeRewritten.
  auto one = rig.tm->Acquire(ids[1], Tier::kHost);
  ASSERT_TRUE(one.ok());
  ASSERT_TRUE(one->Wait().ok());
  std::atomic<bool> rewritten{false};
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    rewritten = true;
    rig.tm->HomeRewritten(ids[0]);
  });
  auto two = rig.tm->Acquire(ids[2], Tier::kHost);
  auto two_data = two.ok() ? two->Wait() : Result<void*>(two.status());
  const bool waited = rewritten.load();
  writer.join();
  ASSERT_TRUE(two_data.ok()) << two_data.status().ToString();
  EXPECT_TRUE(waited) << "the held copy was evicted before its home write ended";
  EXPECT_EQ(Bytes(*two_data, kShard), std::vector<uint8_t>(kShard, 2));
  ASSERT_TRUE(rig.tm->Release(std::move(*two), false).ok());
  // A leased shard is not installed; EndPending(false) drops the installed copy.
  EXPECT_FALSE(*rig.tm->InstallPending(ids[1], fresh.data()));
  ASSERT_TRUE(rig.tm->Release(std::move(*one), false).ok());
  ASSERT_TRUE(*rig.tm->InstallPending(ids[1], fresh.data()));
  rig.tm->EndPending(ids[1], false);
  auto again = rig.tm->Acquire(ids[1], Tier::kHost);
  ASSERT_TRUE(again.ok());
  auto p = again->Wait();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Bytes(*p, kShard), std::vector<uint8_t>(kShard, 1)) << "read from home again";
  ASSERT_TRUE(rig.tm->Release(std::move(*again), false).ok());
  EXPECT_EQ(rig.tm->stats().installs, 2u);
}

TEST(TierManagerTest, RegistrationRefusesShardsThatCouldNeverFit) {
  Rig rig;
  ASSERT_TRUE(rig.Make(1 << 20, 4 << 20).ok());
  auto big = rig.tm->Register({.name = "huge", .bytes = 2 << 20});
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(big.status().message().find("device budget of 1048576"), std::string::npos)
      << big.status().message();
  auto auto_dev = MakeHostDevice({.kind = DeviceKind::kHost, .budget_bytes = 64 << 20});
  ASSERT_TRUE(auto_dev.ok());
  auto pool = PinnedPool::Create({.budget_bytes = 1 << 20});
  ASSERT_TRUE(pool.ok());
  auto auto_arena = DeviceArena::Create(**auto_dev);
  ASSERT_TRUE(auto_arena.ok());
  auto tm = TierManager::Create(**auto_arena, **pool, nullptr, {});
  ASSERT_TRUE(tm.ok()) << tm.status().ToString();
  auto no_swap = (*tm)->Register({.name = "x", .bytes = 4096, .home = Tier::kNvme});
  ASSERT_FALSE(no_swap.ok());
  EXPECT_NE(no_swap.status().message().find("nvme_path"), std::string::npos);
  auto pinned_big = (*tm)->Register({.name = "y", .bytes = 2 << 20, .home = Tier::kHost});
  ASSERT_FALSE(pinned_big.ok());
  EXPECT_NE(pinned_big.status().message().find("pinned budget"), std::string::npos);
}

}  // namespace
}  // namespace zinf::offload

namespace zinf::offload {
namespace {

using namespace tm_rig;  // NOLINT: the rig's helpers

// Overwrite acquires read nothing from home (also under replay: prefetch skips them), and a
// discarded dirty copy is never written home.
TEST(TierManagerTest, OverwriteReadsNothingAndDiscardWritesNothing) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 1 << 20).ok());  // room for 4 shards of 256 KiB
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 6, "g", &ids));
  const TierStats base = rig.tm->stats();
  for (int step = 0; step < 3; ++step) {
    for (int i = 0; i < 6; ++i) {  // "accumulate": overwrite, fill, release dirty
      auto lease = rig.tm->Acquire(ids[i], Tier::kHost, AcquireMode::kOverwrite);
      ASSERT_TRUE(lease.ok()) << lease.status().ToString();
      auto p = lease->Wait();
      ASSERT_TRUE(p.ok());
      std::memset(*p, 100 + step * 10 + i, kShard);
      ASSERT_TRUE(rig.tm->Release(std::move(*lease), true).ok());
    }
    for (int i = 0; i < 6; ++i) {  // "optimizer": read each, spilled ones come back from NVMe
      auto lease = rig.tm->Acquire(ids[i], Tier::kHost);
      ASSERT_TRUE(lease.ok());
      auto p = lease->Wait();
      ASSERT_TRUE(p.ok());
      EXPECT_EQ(Bytes(*p, kShard), std::vector<uint8_t>(kShard, 100 + step * 10 + i));
      ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
    }
    for (auto id : ids) ASSERT_TRUE(rig.tm->Discard(id).ok());
    rig.tm->EndStep();
  }
  const TierStats s = rig.tm->stats();
  EXPECT_EQ(s.overwrites - base.overwrites, 18u);
  EXPECT_EQ(s.discards - base.discards, 18u);
  // Only shards evicted between their write and their read go through NVMe: with six shards
  // and room for four, Belady spills four per step (two while writing, two while reading), each
  // written once and read back at most once — never an overwritten shard's old content, never a
  // discarded copy (without the two modes every step would also read six and write back four).
  const uint64_t reads = (s.nvme_read_bytes - base.nvme_read_bytes) / kShard;
  const uint64_t writes = (s.nvme_write_bytes - base.nvme_write_bytes) / kShard;
  EXPECT_LE(writes, 3u * 4u);
  EXPECT_LE(reads, writes);
  EXPECT_LE(s.peak_host_bytes, 1u << 20);
}

TEST(TierManagerTest, DiscardRefusesALeasedCopyAndOverwriteRefusesTheDevice) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 1, "g", &ids));
  auto lease = rig.tm->Acquire(ids[0], Tier::kHost);
  ASSERT_TRUE(lease.ok());
  EXPECT_EQ(rig.tm->Discard(ids[0]).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
  EXPECT_EQ(rig.tm->Acquire(ids[0], Tier::kDevice, AcquireMode::kOverwrite).status().code(),
            StatusCode::kInvalidArgument);
}

// A host overwrite of a shard with a device copy (an optimizer rewriting the 16-bit weights the
// last forward used): the idle device copy is dropped, so the next device acquire reads the new
// bytes; while a lease holds the device copy the overwrite is refused.
TEST(TierManagerTest, OverwriteDropsAnIdleDeviceCopyAndRefusesALeasedOne) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  std::vector<ShardId> ids;
  ASSERT_NO_FATAL_FAILURE(RegisterFilled(*rig.tm, 1, "w", &ids));
  auto dev = rig.tm->Acquire(ids[0], Tier::kDevice);
  ASSERT_TRUE(dev.ok());
  ASSERT_TRUE(dev->Wait().ok());
  EXPECT_EQ(rig.tm->Acquire(ids[0], Tier::kHost, AcquireMode::kOverwrite).status().code(),
            StatusCode::kFailedPrecondition);
  ASSERT_TRUE(rig.tm->Release(std::move(*dev), false).ok());
  const uint64_t reads = rig.tm->stats().nvme_read_bytes;
  auto host = rig.tm->Acquire(ids[0], Tier::kHost, AcquireMode::kOverwrite);
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  auto p = host->Wait();
  ASSERT_TRUE(p.ok());
  std::memset(*p, 0x5a, kShard);
  ASSERT_TRUE(rig.tm->Release(std::move(*host), true).ok());
  auto again = rig.tm->Acquire(ids[0], Tier::kDevice);
  ASSERT_TRUE(again.ok());
  auto q = again->Wait();
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(Bytes(*q, kShard), std::vector<uint8_t>(kShard, 0x5a));
  ASSERT_TRUE(rig.tm->Release(std::move(*again), false).ok());
  EXPECT_EQ(rig.tm->stats().nvme_read_bytes, reads);  // the overwrite read nothing
}

// A home rewritten behind the manager's back (the optimizer pipeline): idle copies go at once,
// the next acquire reads the new bytes.
TEST(TierManagerTest, HomeRewrittenDropsTheOldCopies) {
  Rig rig;
  ASSERT_TRUE(rig.Make(8 << 20, 4 << 20).ok());
  auto ext = rig.swap->Allocate(kShard);
  ASSERT_TRUE(ext.ok());
  auto id = rig.tm->Register({.name = "p", .bytes = kShard, .home_extent = *ext});
  ASSERT_TRUE(id.ok());
  std::vector<uint8_t> a(kShard, 1), b(kShard, 2);
  ASSERT_TRUE(rig.tm->WriteHome(*id, a.data()).ok());
  ASSERT_NO_FATAL_FAILURE(Touch(*rig.tm, *id, Tier::kDevice));  // device and host copies of a
  auto buf = io::AlignedBuffer::Allocate(kShard, 4096);
  ASSERT_TRUE(buf.ok());
  std::memcpy(buf->data(), b.data(), kShard);
  ASSERT_TRUE(rig.engine->Write(rig.swap->file(), ext->offset, buf->data(), kShard).ok());
  rig.tm->HomeRewritten(*id);
  auto lease = rig.tm->Acquire(*id, Tier::kDevice);
  ASSERT_TRUE(lease.ok());
  auto p = lease->Wait();
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(Bytes(*p, kShard), b);
  ASSERT_TRUE(rig.tm->Release(std::move(*lease), false).ok());
}

}  // namespace
}  // namespace zinf::offload
