// offload/slot_table.h — one tier's memory for shard copies, carved into equal-size slots of a
// few size classes, so that it cannot fragment.
//
// Contract:
// - Create() groups the sizes of the shards the tier will hold into classes: going down from the
//   largest, sizes within a factor of kClassSpread of a class's largest join it, so at most a
//   fifth of a slot is wasted and a model gets a handful of classes (its embedding, block and
//   final units, per role, are far apart; equal units share one class).
//   Each class gets its minimum, then the bytes left go slot by slot to the class whose shards
//   are least covered (slots / shards), until every shard could be resident or no slot fits.
//   The minimum of a class is the leases its roles may hold at once (SlotDemand::role indexes
//   max_leases) plus `spare` (a slot for a copy in transfer: the staging of a load, a bounce
//   write), so that a copy can always move while the leases are held. A region that cannot
//   hold every class's minimum is refused with ResourceExhausted naming each class's need.
// - Take(cls) hands out a free slot of the class, or nothing; Give returns one. So a request
//   of class c can only wait (never fail) while fewer than slots(c) copies of that class are
//   pinned: "accepted at start" means "cannot fail mid-run" for any order of requests.
// - A slot carries the events after which its previous user is done (Slot::ready): device
//   slots are reused without host synchronization by making the next writer's stream wait on
//   them. Host slots leave it empty.
//
// Thread-safety: none; the owner (the tier manager) guards it with its mutex.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/base/device.h"
#include "zinf/status.h"

namespace zinf::offload {

inline constexpr double kClassSpread = 1.25;

struct SlotDemand {
  uint64_t bytes = 0;  // one copy of the shard in this tier
  uint32_t role = 0;   // index into SlotTableOptions::max_leases
};

struct SlotTableOptions {
  std::string tier;                  // "device", "host": for messages
  uint64_t alignment = 256;          // every slot's size and address are multiples of it
  std::vector<uint32_t> max_leases;  // per role: leases held at once by every thread together
  std::vector<std::string> role_names;  // per role, for messages
  uint32_t spare = 1;                // slots per class beyond the leases
};

struct Slot {
  void* ptr = nullptr;
  uint32_t index = 0;        // within the table
  std::vector<Event> ready;  // the previous user's last work (device slots)
};

struct SlotClassInfo {
  uint64_t slot_bytes = 0;
  uint64_t smallest = 0;  // the smallest shard size in the class
  uint32_t slots = 0;
  uint32_t min_slots = 0;
  uint32_t shards = 0;
};

class SlotTable {
 public:
  SlotTable() = default;  // empty: no classes, nothing to take
  // Plans and carves [base, base + bytes) for these shards (empty: an empty table).
  static Result<SlotTable> Create(void* base, uint64_t bytes,
                                  const std::vector<SlotDemand>& shards,
                                  const SlotTableOptions& options);
  // The bytes Create needs for the classes' minimums alone (for start-up checks and messages).
  static uint64_t MinimumBytes(const std::vector<SlotDemand>& shards,
                               const SlotTableOptions& options);

  // The class a copy of `bytes` uses; -1 when no class holds it (it was not planned for).
  int ClassFor(uint64_t bytes) const;
  bool Take(int cls, Slot* out);
  void Give(int cls, Slot slot);

  size_t classes() const { return classes_.size(); }
  const SlotClassInfo& info(int cls) const { return classes_[cls].info; }
  uint32_t free_slots(int cls) const { return static_cast<uint32_t>(classes_[cls].free.size()); }
  uint64_t in_use_bytes() const { return in_use_; }
  uint64_t peak_bytes() const { return peak_; }
  uint64_t carved_bytes() const { return carved_; }
  // One line per class: "4 x 1.0 MiB (min 3) for 12 shards".
  std::string Describe() const;

 private:
  struct Class {
    SlotClassInfo info;
    std::vector<Slot> free;
  };
  // Classes of these sizes (descending), each with its shards' roles counted.
  static std::vector<SlotClassInfo> Group(const std::vector<SlotDemand>& shards,
                                          const SlotTableOptions& o);
  std::vector<Class> classes_;
  uint64_t alignment_ = 1;
  uint64_t in_use_ = 0, peak_ = 0, carved_ = 0;
};

}  // namespace zinf::offload
