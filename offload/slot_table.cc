#include "offload/slot_table.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "src/base/units.h"

namespace zinf::offload {
namespace {

uint64_t RoundUp(uint64_t bytes, uint64_t align) { return (bytes + align - 1) / align * align; }

}  // namespace

std::vector<SlotClassInfo> SlotTable::Group(const std::vector<SlotDemand>& shards,
                                            const SlotTableOptions& o) {
  std::map<uint64_t, std::vector<uint32_t>, std::greater<>> by_size;  // size -> roles
  for (const SlotDemand& d : shards) by_size[RoundUp(d.bytes, o.alignment)].push_back(d.role);
  std::vector<SlotClassInfo> classes;
  std::vector<std::map<uint32_t, uint32_t>> roles;  // per class: role -> shards
  for (const auto& [size, rs] : by_size) {
    const bool join = !classes.empty() && static_cast<double>(size) * kClassSpread >=
                                              static_cast<double>(classes.back().slot_bytes);
    if (!join) {
      classes.push_back({.slot_bytes = size});
      roles.emplace_back();
    }
    classes.back().smallest = size;
    classes.back().shards += static_cast<uint32_t>(rs.size());
    for (uint32_t r : rs) roles.back()[r]++;
  }
  for (size_t c = 0; c < classes.size(); ++c) {
    uint32_t need = o.spare;
    for (const auto& [role, count] : roles[c]) {
      const uint32_t leases = role < o.max_leases.size() ? o.max_leases[role] : 1;
      need += std::min(leases, count);
    }
    // A class never holds more copies than it has shards.
    classes[c].min_slots = std::min(need, classes[c].shards);
  }
  return classes;
}

uint64_t SlotTable::MinimumBytes(const std::vector<SlotDemand>& shards,
                                 const SlotTableOptions& options) {
  uint64_t total = 0;
  for (const SlotClassInfo& c : Group(shards, options)) total += c.min_slots * c.slot_bytes;
  return total;
}

Result<SlotTable> SlotTable::Create(void* base, uint64_t bytes,
                                    const std::vector<SlotDemand>& shards,
                                    const SlotTableOptions& o) {
  SlotTable t;
  t.alignment_ = o.alignment;
  if (shards.empty()) return t;
  std::vector<SlotClassInfo> classes = Group(shards, o);
  uint64_t need = 0;
  std::string parts;
  for (const SlotClassInfo& c : classes) {
    need += c.min_slots * c.slot_bytes;
    parts += fmt::format("{}{} x {} bytes ({})", parts.empty() ? "" : ", ", c.min_slots,
                         c.slot_bytes, FormatBytesHuman(c.slot_bytes));
  }
  if (need > bytes) {
    return ResourceExhausted(fmt::format(
        "{} tier: {} bytes ({}) are left for shard copies, but the copies that must fit at "
        "once need {} bytes ({}): {} (for each size of shard, the leases held at once plus {} "
        "in transfer)",
        o.tier, bytes, FormatBytesHuman(bytes), need, FormatBytesHuman(need), parts, o.spare));
  }
  for (SlotClassInfo& c : classes) c.slots = c.min_slots;
  // The rest, slot by slot, to the least covered class that still fits.
  uint64_t left = bytes - need;
  for (;;) {
    int best = -1;
    double best_cover = 0;
    for (size_t i = 0; i < classes.size(); ++i) {
      const SlotClassInfo& c = classes[i];
      if (c.slots >= c.shards || c.slot_bytes > left) continue;
      const double cover = static_cast<double>(c.slots) / c.shards;
      if (best < 0 || cover < best_cover) {
        best = static_cast<int>(i);
        best_cover = cover;
      }
    }
    if (best < 0) break;
    classes[best].slots++;
    left -= classes[best].slot_bytes;
  }
  auto* p = static_cast<uint8_t*>(base);
  uint32_t index = 0;
  for (const SlotClassInfo& info : classes) {
    Class cls;
    cls.info = info;
    // Handed out from the back: the first slots go first.
    for (uint32_t k = info.slots; k-- > 0;) {
      cls.free.push_back(Slot{p + k * info.slot_bytes, index + k, {}});
    }
    p += info.slots * info.slot_bytes;
    index += info.slots;
    t.carved_ += info.slots * info.slot_bytes;
    t.classes_.push_back(std::move(cls));
  }
  return t;
}

int SlotTable::ClassFor(uint64_t bytes) const {
  const uint64_t r = RoundUp(bytes, alignment_);
  for (size_t i = 0; i < classes_.size(); ++i) {
    const SlotClassInfo& c = classes_[i].info;
    if (c.smallest <= r && r <= c.slot_bytes) return static_cast<int>(i);
  }
  return -1;
}

bool SlotTable::Take(int cls, Slot* out) {
  Class& c = classes_[cls];
  if (c.free.empty()) return false;
  *out = std::move(c.free.back());
  c.free.pop_back();
  in_use_ += c.info.slot_bytes;
  peak_ = std::max(peak_, in_use_);
  return true;
}

void SlotTable::Give(int cls, Slot slot) {
  Class& c = classes_[cls];
  for (const Slot& f : c.free) {
    if (f.index == slot.index) {
      std::fprintf(stderr, "SlotTable: slot %u given back twice\n", slot.index);
      std::abort();
    }
  }
  in_use_ -= c.info.slot_bytes;
  c.free.push_back(std::move(slot));
}

std::string SlotTable::Describe() const {
  std::string out;
  for (const Class& c : classes_) {
    out += fmt::format("{}{} x {} ({} bytes; min {}) for {} shard(s)", out.empty() ? "" : ", ",
                       c.info.slots, FormatBytesHuman(c.info.slot_bytes), c.info.slot_bytes,
                       c.info.min_slots, c.info.shards);
  }
  return out;
}

}  // namespace zinf::offload
