#include "src/train/placement.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/units.h"

namespace zinf::train {

std::string StatePlacement::Describe(const Model& d) const {
  std::vector<std::string> ranges;
  uint32_t nvme_units = 0;
  for (uint32_t u = 0; u < in_memory.size();) {
    if (!in_memory[u]) {
      ++nvme_units;
      ++u;
      continue;
    }
    uint32_t end = u;
    while (end + 1 < in_memory.size() && in_memory[end + 1]) ++end;
    ranges.push_back(end == u ? d.UnitName(u) : d.UnitName(u) + ".." + d.UnitName(end));
    u = end + 1;
  }
  std::string mem = ranges.empty() ? std::string("no unit")
                                   : fmt::format("{}", fmt::join(ranges, ", "));
  return fmt::format("{} in memory ({}); {} unit{} on NVMe ({})", mem,
                     FormatBytesHuman(memory_bytes), nvme_units, nvme_units == 1 ? "" : "s",
                     FormatBytesHuman(nvme_bytes));
}

namespace {

Result<std::vector<char>> ReadPlacementFile(const Model& d, const std::string& path) {
  std::ifstream in(path);
  if (!in) return InvalidArgument(fmt::format("--placement {}: cannot open the file", path));
  nlohmann::json j;
  try {
    in >> j;
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(fmt::format("--placement {}: not JSON: {}", path, e.what()));
  }
  if (!j.is_object() || !j.contains("optimizer_state") || !j["optimizer_state"].is_object()) {
    return InvalidArgument(fmt::format(
        "--placement {}: expected an object {{\"optimizer_state\": {{\"<unit>\": \"memory\" | "
        "\"nvme\", ...}}}}",
        path));
  }
  for (const auto& [key, value] : j.items()) {
    if (key != "optimizer_state") {
      return InvalidArgument(fmt::format("--placement {}: unknown key \"{}\" (expected "
                                         "\"optimizer_state\")", path, key));
    }
  }
  std::vector<char> in_memory(d.units(), 0);
  for (const auto& [name, home] : j["optimizer_state"].items()) {
    uint32_t unit = d.units();
    for (uint32_t u = 0; u < d.units(); ++u) {
      if (d.UnitName(u) == name) unit = u;
    }
    if (unit == d.units()) {
      return InvalidArgument(fmt::format(
          "--placement {}: optimizer_state.{}: no such unit; the model's are {}, {}..{}, {}",
          path, name, d.UnitName(0), d.UnitName(1), d.UnitName(d.final_unit() - 1),
          d.UnitName(d.final_unit())));
    }
    if (!home.is_string() || (home != "memory" && home != "nvme")) {
      return InvalidArgument(fmt::format("--placement {}: optimizer_state.{}: {}; expected "
                                         "\"memory\" or \"nvme\"", path, name, home.dump()));
    }
    in_memory[unit] = home == "memory" ? 1 : 0;
  }
  return in_memory;
}

}  // namespace

Result<StatePlacement> PlaceOptimizerState(const Model& d, const Config& c,
                                           const std::string& placement,
                                           uint64_t state_bytes_per_param,
                                           const std::function<uint64_t(uint32_t)>& state_elems,
                                           uint64_t available_bytes,
                                           const std::vector<std::string>* recorded) {
  StatePlacement p;
  p.how = placement.empty() ? "auto" : placement;
  const uint32_t units = d.units();
  const bool nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  auto bytes = [&](uint32_t u) { return state_bytes_per_param * state_elems(u); };
  if (p.how == "auto" && recorded != nullptr && nvme) {
    p.how = "the checkpoint's";
    p.in_memory.assign(units, 0);
    for (const std::string& name : *recorded) {
      bool found = false;
      for (uint32_t u = 0; u < units; ++u) {
        if (d.UnitName(u) == name) p.in_memory[u] = found = true;
      }
      if (!found) {
        return InvalidArgument(fmt::format(
            "the checkpoint keeps the optimizer state of \"{}\" in memory: no such unit", name));
      }
    }
  } else if (p.how == "auto" || p.how == "nvme") {
    p.in_memory.assign(units, nvme ? 0 : 1);
    const std::optional<uint64_t>& host = c.zinf.budgets.host_bytes;
    if (nvme && p.how == "auto" && host) {
      uint64_t used = 0;
      for (uint32_t k = units; k-- > 0;) {
        if (used + bytes(k) > *host) break;
        used += bytes(k);
        p.in_memory[k] = 1;
      }
    }
  } else {
    if (!nvme) {
      return InvalidArgument(fmt::format(
          "--placement {}: a placement file places optimizer state on NVMe or in memory, but "
          "zero_optimization.offload_optimizer.device is not \"nvme\" (all of it is in memory)",
          p.how));
    }
    ZINF_ASSIGN_OR_RETURN(p.in_memory, ReadPlacementFile(d, p.how));
  }
  for (uint32_t u = 0; u < units; ++u) (p.in_memory[u] ? p.memory_bytes : p.nvme_bytes) += bytes(u);
  if (!nvme) return p;  // the config's own memory home: sized by the model, as ever
  const std::optional<uint64_t>& host = c.zinf.budgets.host_bytes;
  if (host && p.memory_bytes > *host) {
    return ResourceExhausted(fmt::format(
        "--placement {}: {} bytes ({}) of optimizer state in memory, more than "
        "zinf.budgets.host_bytes {} ({}); place fewer units in memory or raise the budget",
        p.how, p.memory_bytes, FormatBytesHuman(p.memory_bytes), *host,
        FormatBytesHuman(*host)));
  }
  if (p.memory_bytes > 0 && available_bytes > 0 && p.memory_bytes > available_bytes) {
    return ResourceExhausted(fmt::format(
        "--placement {}: {} bytes ({}) of optimizer state in memory, but this machine has {} "
        "bytes ({}) available beside the pinned budget; lower zinf.budgets.host_bytes or place "
        "fewer units in memory",
        p.how, p.memory_bytes, FormatBytesHuman(p.memory_bytes), available_bytes,
        FormatBytesHuman(available_bytes)));
  }
  return p;
}

}  // namespace zinf::train
