// The tier manager tests' rig: a TierManager over the host-emulated device, an io_uring engine
// behind a fault injector and a 64 MiB swap file in a temporary directory, and helpers to fill,
// touch and read shards. Single-threaded set-up; the manager itself is thread-safe.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "io/fault_backend.h"
#include "offload/tier_manager.h"
#include "tests/test_util.h"

namespace zinf::offload::tm_rig {

using zinf::testing::TempDir;

struct Rig {
  TempDir dir;
  std::unique_ptr<Device> device;
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<io::Engine> engine;
  io::FaultInjectingBackend* faults = nullptr;
  std::unique_ptr<SwapSpace> swap;
  std::unique_ptr<PinnedPool> pool;
  std::unique_ptr<TierManager> tm;
  uint32_t queue_depth = 8;  // the engine's pieces in flight at once; set before Make

  Status Make(uint64_t device_budget, uint64_t pinned_budget, bool prefetch = true,
              double copy_gbps = 0, bool write_behind = false) {
    ZINF_ASSIGN_OR_RETURN(device, MakeHostDevice({.kind = DeviceKind::kHost,
                                                  .budget_bytes = device_budget,
                                                  .copy_gbps = copy_gbps}));
    ZINF_ASSIGN_OR_RETURN(auto raw, io::MakeUringBackend({8, 0}));
    auto fb = std::make_unique<io::FaultInjectingBackend>(std::move(raw), nullptr);
    faults = fb.get();
    engine = io::Engine::WithBackend(std::move(fb), {.block_size = 256 << 10, .queue_depth = queue_depth});
    ZINF_ASSIGN_OR_RETURN(swap, SwapSpace::Create(*engine, {.dirs = {dir.path()},
                                                            .size = 64 << 20}));
    ZINF_ASSIGN_OR_RETURN(pool, PinnedPool::Create({.budget_bytes = pinned_budget}));
    ZINF_ASSIGN_OR_RETURN(arena, DeviceArena::Create(*device));
    ZINF_ASSIGN_OR_RETURN(tm, TierManager::Create(*arena, *pool, swap.get(),
                                                  {.prefetch = prefetch,
                                                   .write_behind = write_behind}));
    return Status::Ok();
  }

  // Seals with `device` and `host` leases of every role held at once, and these spares.
  Status Seal(uint32_t device, uint32_t host, uint32_t device_spare = 0, uint32_t host_spare = 1) {
    SealOptions o;
    o.max_leases[0].fill(device);
    o.max_leases[1].fill(host);
    o.spare = {device_spare, host_spare};
    return tm->Seal(o);
  }
};

// Holds every completion of the rig's drive (FaultInjectingBackend::HoldCompletions) from
// construction until Release or destruction, so that however a test ends the drive goes on
// before what waits on it is joined and the rig's engine drains.
class HeldDrive {
 public:
  explicit HeldDrive(io::FaultInjectingBackend* f) : f_(f) { f_->HoldCompletions(true); }
  ~HeldDrive() { Release(); }
  HeldDrive(const HeldDrive&) = delete;
  HeldDrive& operator=(const HeldDrive&) = delete;
  void Release() { f_->HoldCompletions(false); }

 private:
  io::FaultInjectingBackend* f_;
};

// Registers n shards of kShard bytes homed on NVMe, shard i filled with the byte i.
inline constexpr uint64_t kShard = 256 << 10;
// Every shard is registered before the first WriteHome (which seals the manager).
inline void RegisterFilled(TierManager& tm, int n, const char* prefix, std::vector<ShardId>* ids) {
  const size_t first = ids->size();
  for (int i = 0; i < n; ++i) {
    auto id = tm.Register({.name = fmt::format("{}{}", prefix, i), .bytes = kShard});
    ASSERT_TRUE(id.ok()) << id.status().ToString();
    ids->push_back(*id);
  }
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> c(kShard, static_cast<uint8_t>(i));
    ASSERT_TRUE(tm.WriteHome((*ids)[first + i], c.data()).ok());
  }
}

// For a manager sealed after registering n shards (ids 0..n-1): fills shard i with the byte i.
inline void RegisterFilledSealed(TierManager& tm, int n, std::vector<ShardId>* ids) {
  for (int i = 0; i < n; ++i) {
    std::vector<uint8_t> c(kShard, static_cast<uint8_t>(i));
    ASSERT_TRUE(tm.WriteHome(static_cast<ShardId>(i), c.data()).ok());
    ids->push_back(static_cast<ShardId>(i));
  }
}

// Acquires a shard, waits for it and releases it clean.
inline void Touch(TierManager& tm, ShardId id, Tier tier) {
  auto lease = tm.Acquire(id, tier);
  ASSERT_TRUE(lease.ok()) << lease.status().ToString();
  ASSERT_TRUE(lease->Wait().ok());
  ASSERT_TRUE(tm.Release(std::move(*lease), false).ok());
}

// Reads the bytes of a leased copy (the host device's memory is host memory).
inline std::vector<uint8_t> Bytes(void* p, uint64_t n) {
  auto* b = static_cast<uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// A kShard-byte shard's copy in `tier`, read through a lease released clean (empty on failure).
inline std::vector<uint8_t> LeasedBytes(TierManager& tm, ShardId id, Tier tier) {
  auto lease = tm.Acquire(id, tier);
  EXPECT_TRUE(lease.ok()) << lease.status().ToString();
  if (!lease.ok()) return {};
  auto p = lease->Wait();
  EXPECT_TRUE(p.ok()) << p.status().ToString();
  std::vector<uint8_t> out = p.ok() ? Bytes(*p, kShard) : std::vector<uint8_t>();
  EXPECT_TRUE(tm.Release(std::move(*lease), false).ok());
  return out;
}

}  // namespace zinf::offload::tm_rig
