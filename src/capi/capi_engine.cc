// The C ABI's engine (include/zinf/zinf.h): the caller's tensors registered as shards of zinf's
// tier manager (offload/tier_manager.h), built from a JSON config by the offload runtime
// (src/runtime/offload_runtime.h) once every tensor is registered: the swap file is sized for
// the NVMe-homed tensors, then the memory is planned (Seal) with the leases the caller declared.
// Leases are handed out as numbers, so a lease released twice or never acquired is an error,
// never a use of freed memory.
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "offload/tier_manager.h"
#include "src/base/device.h"
#include "src/capi/capi_adam.h"
#include "src/capi/capi_status.h"
#include "src/config/config.h"
#include "src/runtime/offload_runtime.h"
#include "zinf/zinf.h"

namespace zinf::capi {
namespace {

struct LeaseEntry {
  std::mutex mu;  // a wait and a release of this lease are serialized
  offload::Lease lease;
  uint64_t tensor = 0;
};

}  // namespace
}  // namespace zinf::capi

struct zinf_engine {
  zinf::Config config;
  zinf::DeviceKind device_kind = zinf::DeviceKind::kAuto;
  zinf::offload::SealOptions seal;
  std::mutex mu;  // everything below
  std::vector<zinf::offload::ShardSpec> specs;
  std::unique_ptr<zinf::OffloadRuntime> rt;  // built by the seal
  std::unordered_map<uint64_t, std::shared_ptr<zinf::capi::LeaseEntry>> leases;
  uint64_t next_lease = 1;
};

namespace zinf::capi {
namespace {

using offload::Tier;

Status Open(const zinf_engine_params* p, zinf_engine** out) {
  if (out == nullptr) return InvalidArgument("zinf_engine_open: out is NULL");
  *out = nullptr;
  ZINF_RETURN_IF_ERROR(CheckSized(p, p == nullptr ? 0 : p->size, sizeof(zinf_engine_params),
                                  "zinf_engine_open: params"));
  auto e = std::make_unique<zinf_engine>();
  ConfigParseOptions po;
  po.validate = true;
  po.model_rules = false;  // the caller's tensors are paged, not zinf.model
  if (p->config_path != nullptr) {
    ZINF_ASSIGN_OR_RETURN(e->config, Config::FromFile(p->config_path, po));
  } else if (p->config_json != nullptr) {
    po.source_name = "zinf_engine_params.config_json";
    ZINF_ASSIGN_OR_RETURN(e->config, Config::FromString(p->config_json, po));
  }
  auto kind = ParseDeviceKind(p->device == nullptr ? "auto" : p->device);
  if (!kind.ok()) return kind.status().WithContext("zinf_engine_open: params.device");
  e->device_kind = *kind;
  for (size_t r = 0; r < offload::kRoles; ++r) {
    e->seal.max_leases[0][r] = p->device_leases[r];
    e->seal.max_leases[1][r] = p->host_leases[r];
  }
  *out = e.release();
  return Status::Ok();
}

Status CheckEngine(zinf_engine* e, const char* call) {
  if (e == nullptr) return InvalidArgument(fmt::format("{}: engine is NULL", call));
  return Status::Ok();
}

Status Register(zinf_engine* e, const zinf_tensor_spec* spec, uint64_t* id) {
  ZINF_RETURN_IF_ERROR(CheckEngine(e, "zinf_tensor_register"));
  if (id == nullptr) return InvalidArgument("zinf_tensor_register: id is NULL");
  ZINF_RETURN_IF_ERROR(CheckSized(spec, spec == nullptr ? 0 : spec->size,
                                  sizeof(zinf_tensor_spec), "zinf_tensor_register: spec"));
  std::lock_guard lock(e->mu);
  const uint64_t next = e->specs.size();
  offload::ShardSpec s;
  s.name = spec->name != nullptr ? spec->name : fmt::format("tensor{}", next);
  auto bad = [&](const std::string& what) {
    return InvalidArgument(fmt::format("zinf_tensor_register: tensor {}: {}", s.name, what));
  };
  if (e->rt != nullptr) {
    return FailedPrecondition(fmt::format(
        "zinf_tensor_register: tensor {}: the engine is sealed (register every tensor before "
        "zinf_engine_seal and the first acquire, read or write)", s.name));
  }
  if (spec->bytes == 0) return bad("bytes is 0; expected > 0");
  if (spec->role < 0 || spec->role >= ZINF_ROLES) {
    return bad(fmt::format("role {}; expected ZINF_ROLE_PARAM .. ZINF_ROLE_GRAD (0..4)",
                           spec->role));
  }
  if (spec->home == ZINF_TIER_NVME) {
    if (e->config.SwapDir().empty() && e->config.zinf.stripe_paths.empty()) {
      return FailedPrecondition(fmt::format(
          "zinf_tensor_register: tensor {} is homed on NVMe but {} names no directory for the "
          "swap file (set zinf.swap_dir, zinf.stripe_paths or an offload nvme_path)",
          s.name, e->config.source));
    }
    s.home = Tier::kNvme;
  } else if (spec->home == ZINF_TIER_HOST) {
    s.home = Tier::kHost;
  } else {
    return bad(fmt::format("home {}; expected ZINF_TIER_HOST (1) or ZINF_TIER_NVME (2)",
                           spec->home));
  }
  s.role = static_cast<offload::Role>(spec->role);
  s.bytes = spec->bytes;
  s.unit = spec->unit;
  e->specs.push_back(std::move(s));
  *id = next;
  return Status::Ok();
}

// Builds the runtime and plans the memory. REQUIRES: e->mu held.
Status SealLocked(zinf_engine* e) {
  if (e->rt != nullptr) return Status::Ok();
  RuntimeOptions ro;
  ro.device_kind = e->device_kind;
  bool nvme = false;
  for (const auto& s : e->specs) {
    if (s.home != Tier::kNvme) continue;
    nvme = true;
    ro.swap_bytes += s.bytes + e->config.zinf.stripe_bytes + 4096;  // alignment slack
  }
  ro.use_nvme = nvme;
  ro.model_rules = false;
  ro.write_behind = e->config.zinf.write_behind;
  ZINF_ASSIGN_OR_RETURN(auto rt, MakeOffloadRuntime(e->config, ro));
  for (size_t i = 0; i < e->specs.size(); ++i) {
    auto id = rt->tiers->Register(e->specs[i]);
    if (!id.ok()) return id.status().WithContext("zinf_engine_seal");
    if (*id != i) return Internal("zinf_engine_seal: tensor handles out of order");
  }
  Status s = rt->tiers->Seal(e->seal);
  if (!s.ok()) {
    return s.WithContext(fmt::format("zinf_engine_seal: the leases declared in "
                                     "zinf_engine_params ({} tensors registered)",
                                     e->specs.size()));
  }
  e->rt = std::move(rt);
  return Status::Ok();
}

// The sealed tier manager and the tensor's checked handle.
Result<offload::TierManager*> Tiers(zinf_engine* e, uint64_t id, const char* call) {
  ZINF_RETURN_IF_ERROR(CheckEngine(e, call));
  std::lock_guard lock(e->mu);
  if (id >= e->specs.size()) {
    return NotFound(fmt::format("{}: tensor {} is not registered ({} are)", call, id,
                                e->specs.size()));
  }
  ZINF_RETURN_IF_ERROR(SealLocked(e));
  return e->rt->tiers.get();
}

Status Acquire(zinf_engine* e, uint64_t id, int tier, int mode, uint64_t* lease) {
  if (lease == nullptr) return InvalidArgument("zinf_acquire: lease is NULL");
  ZINF_ASSIGN_OR_RETURN(offload::TierManager * tiers, Tiers(e, id, "zinf_acquire"));
  const std::string& name = e->specs[id].name;
  if (tier != ZINF_TIER_DEVICE && tier != ZINF_TIER_HOST) {
    return InvalidArgument(fmt::format(
        "zinf_acquire: tensor {}: tier {}; expected ZINF_TIER_DEVICE (0) or ZINF_TIER_HOST (1)",
        name, tier));
  }
  if (mode < ZINF_ACQUIRE_READ || mode > ZINF_ACQUIRE_UNTRACED) {
    return InvalidArgument(fmt::format("zinf_acquire: tensor {}: mode {}; expected "
                                       "ZINF_ACQUIRE_READ, _OVERWRITE or _UNTRACED", name, mode));
  }
  if (mode == ZINF_ACQUIRE_OVERWRITE && tier != ZINF_TIER_HOST) {
    return InvalidArgument(fmt::format(
        "zinf_acquire: tensor {}: ZINF_ACQUIRE_OVERWRITE is for the host tier only", name));
  }
  auto entry = std::make_shared<LeaseEntry>();
  entry->tensor = id;
  ZINF_ASSIGN_OR_RETURN(entry->lease,
                        tiers->Acquire(id, static_cast<Tier>(tier),
                                       static_cast<offload::AcquireMode>(mode)));
  std::lock_guard lock(e->mu);
  *lease = e->next_lease++;
  e->leases.emplace(*lease, std::move(entry));
  return Status::Ok();
}

Result<std::shared_ptr<LeaseEntry>> FindLease(zinf_engine* e, uint64_t lease, const char* call,
                                              bool remove) {
  ZINF_RETURN_IF_ERROR(CheckEngine(e, call));
  std::lock_guard lock(e->mu);
  auto it = e->leases.find(lease);
  if (it == e->leases.end()) {
    return NotFound(fmt::format("{}: lease {} is not held ({})", call, lease,
                                lease == 0 || lease >= e->next_lease ? "never acquired"
                                                                     : "released already"));
  }
  auto entry = it->second;
  if (remove) e->leases.erase(it);
  return entry;
}

Status Wait(zinf_engine* e, uint64_t lease, void** ptr) {
  if (ptr == nullptr) return InvalidArgument("zinf_lease_wait: ptr is NULL");
  ZINF_ASSIGN_OR_RETURN(auto entry, FindLease(e, lease, "zinf_lease_wait", false));
  std::lock_guard lock(entry->mu);
  if (!entry->lease.valid()) {
    return NotFound(fmt::format("zinf_lease_wait: lease {} was released", lease));
  }
  auto p = entry->lease.Wait();
  if (!p.ok()) {
    return p.status().WithContext(
        fmt::format("zinf_lease_wait: tensor {}", e->specs[entry->tensor].name));
  }
  *ptr = *p;
  return Status::Ok();
}

Status Release(zinf_engine* e, uint64_t lease, int dirty) {
  ZINF_ASSIGN_OR_RETURN(auto entry, FindLease(e, lease, "zinf_release", true));
  std::lock_guard lock(entry->mu);
  return e->rt->tiers->Release(std::move(entry->lease), dirty != 0);
}

Status Close(zinf_engine* e) {
  if (e == nullptr) return Status::Ok();
  std::unique_ptr<zinf_engine> owned(e);
  Status first;
  for (auto& [id, entry] : e->leases) {
    std::lock_guard lock(entry->mu);
    Status s = e->rt->tiers->Release(std::move(entry->lease), false);
    if (first.ok() && !s.ok()) first = s;
  }
  e->leases.clear();
  return first.ok() ? first : first.WithContext("zinf_engine_close");
}

Status Stats(zinf_engine* e, const char** out) {
  ZINF_RETURN_IF_ERROR(CheckEngine(e, "zinf_engine_stats"));
  if (out == nullptr) return InvalidArgument("zinf_engine_stats: json is NULL");
  static thread_local std::string text;
  nlohmann::ordered_json j;
  std::lock_guard lock(e->mu);
  j["tensors"] = e->specs.size();
  j["sealed"] = e->rt != nullptr;
  j["leases_held"] = e->leases.size();
  if (e->rt != nullptr) {
    const offload::TierStats t = e->rt->tiers->stats();
    j["device"] = DeviceKindName(e->rt->device->kind());
    j["budgets"] = {{"device_bytes", e->rt->arena->budget_bytes()},
                    {"pinned_bytes", e->rt->pool->budget_bytes()}};
    j["peak_bytes"] = {{"device", t.peak_device_bytes}, {"host", t.peak_host_bytes},
                       {"device_arena", e->rt->arena->peak_bytes()},
                       {"pinned_pool", e->rt->pool->peak_bytes()}};
    j["bytes"] = {{"nvme_read", t.nvme_read_bytes}, {"nvme_write", t.nvme_write_bytes},
                  {"h2d", t.h2d_bytes}, {"d2h", t.d2h_bytes}};
    j["busy_seconds"] = {{"nvme_read", t.nvme_read_busy_seconds},
                         {"nvme_write", t.nvme_write_busy_seconds},
                         {"h2d", t.h2d_busy_seconds}, {"d2h", t.d2h_busy_seconds}};
    j["stall_seconds"] = t.stall_seconds;
    j["prefetch"] = {{"hits", t.prefetch_hits}, {"misses", t.prefetch_misses},
                     {"trace", e->rt->tiers->has_trace()}};
    j["evictions"] = {{"device", t.device_evictions}, {"host", t.host_evictions},
                      {"writebacks", t.writebacks},
                      {"write_behinds", t.write_behinds}};
    j["slots"] = e->rt->tiers->DescribeSlots();
  }
  text = j.dump();
  *out = text.c_str();
  return Status::Ok();
}

Status AdamStepTensors(zinf_engine* e, zinf_adam* adam, int64_t step, float lr, uint64_t param,
                       const void* grad, int grad_dtype, uint64_t exp_avg, uint64_t exp_avg_sq,
                       uint64_t param16, int param16_dtype) {
  constexpr const char* kCall = "zinf_engine_adam_step";
  if (adam == nullptr) return InvalidArgument("zinf_engine_adam_step: adam is NULL");
  ZINF_ASSIGN_OR_RETURN(offload::TierManager * tiers, Tiers(e, param, kCall));
  for (uint64_t id : {exp_avg, exp_avg_sq}) ZINF_RETURN_IF_ERROR(Tiers(e, id, kCall).status());
  if (param16 != ZINF_NO_TENSOR) ZINF_RETURN_IF_ERROR(Tiers(e, param16, kCall).status());
  const uint64_t bytes = e->specs[param].bytes;
  const uint64_t n = bytes / 4;
  auto mismatch = [&](uint64_t id, uint64_t want) -> Status {
    if (e->specs[id].bytes == want) return Status::Ok();
    return InvalidArgument(fmt::format("{}: tensor {} holds {} bytes; expected {} for {} "
                                       "elements of tensor {}", kCall, e->specs[id].name,
                                       e->specs[id].bytes, want, n, e->specs[param].name));
  };
  if (bytes % 4 != 0) {
    return InvalidArgument(fmt::format("{}: tensor {} holds {} bytes; expected fp32 (a multiple "
                                       "of 4)", kCall, e->specs[param].name, bytes));
  }
  ZINF_RETURN_IF_ERROR(mismatch(exp_avg, bytes));
  ZINF_RETURN_IF_ERROR(mismatch(exp_avg_sq, bytes));
  if (param16 != ZINF_NO_TENSOR) ZINF_RETURN_IF_ERROR(mismatch(param16, n * 2));
  if (grad == nullptr) return InvalidArgument(fmt::format("{}: grad is NULL", kCall));

  std::vector<std::pair<uint64_t, offload::AcquireMode>> want = {
      {param, offload::AcquireMode::kRead},
      {exp_avg, offload::AcquireMode::kRead},
      {exp_avg_sq, offload::AcquireMode::kRead}};
  if (param16 != ZINF_NO_TENSOR) want.push_back({param16, offload::AcquireMode::kOverwrite});
  std::vector<offload::Lease> leases;
  std::vector<void*> ptrs;
  Status status;
  for (auto [id, mode] : want) {
    auto l = tiers->Acquire(id, Tier::kHost, mode);
    if (!l.ok()) {
      status = l.status();
      break;
    }
    leases.push_back(std::move(*l));
  }
  for (size_t i = 0; status.ok() && i < leases.size(); ++i) {
    auto p = leases[i].Wait();
    if (!p.ok()) status = p.status();
    else ptrs.push_back(*p);
  }
  if (status.ok()) {
    status = Step(adam, step, lr, static_cast<float*>(ptrs[0]), grad, grad_dtype,
                  static_cast<float*>(ptrs[1]), static_cast<float*>(ptrs[2]), n,
                  param16 != ZINF_NO_TENSOR ? ptrs[3] : nullptr, param16_dtype);
  }
  const bool written = status.ok();
  for (auto& l : leases) {
    Status s = tiers->Release(std::move(l), written);
    if (status.ok() && !s.ok()) status = s;
  }
  return status.ok() ? status
                     : status.WithContext(fmt::format("{}: tensor {}", kCall,
                                                      e->specs[param].name));
}

}  // namespace
}  // namespace zinf::capi

extern "C" {

using zinf::capi::Guard;

ZINF_API int zinf_engine_open(const zinf_engine_params* params, zinf_engine** out) {
  return Guard("zinf_engine_open", [&] { return zinf::capi::Open(params, out); });
}

ZINF_API int zinf_engine_close(zinf_engine* engine) {
  return Guard("zinf_engine_close", [&] { return zinf::capi::Close(engine); });
}

ZINF_API int zinf_tensor_register(zinf_engine* engine, const zinf_tensor_spec* spec,
                                  uint64_t* id) {
  return Guard("zinf_tensor_register", [&] { return zinf::capi::Register(engine, spec, id); });
}

ZINF_API int zinf_engine_seal(zinf_engine* engine) {
  return Guard("zinf_engine_seal", [&] {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckEngine(engine, "zinf_engine_seal"));
    std::lock_guard lock(engine->mu);
    return zinf::capi::SealLocked(engine);
  });
}

ZINF_API int zinf_tensor_write(zinf_engine* engine, uint64_t id, const void* src) {
  return Guard("zinf_tensor_write", [&]() -> zinf::Status {
    ZINF_ASSIGN_OR_RETURN(auto* tiers, zinf::capi::Tiers(engine, id, "zinf_tensor_write"));
    if (src == nullptr) return zinf::InvalidArgument("zinf_tensor_write: src is NULL");
    return tiers->WriteHome(id, src).WithContext("zinf_tensor_write");
  });
}

ZINF_API int zinf_tensor_read(zinf_engine* engine, uint64_t id, void* dst) {
  return Guard("zinf_tensor_read", [&]() -> zinf::Status {
    ZINF_ASSIGN_OR_RETURN(auto* tiers, zinf::capi::Tiers(engine, id, "zinf_tensor_read"));
    if (dst == nullptr) return zinf::InvalidArgument("zinf_tensor_read: dst is NULL");
    ZINF_RETURN_IF_ERROR(tiers->Flush().WithContext("zinf_tensor_read: flush"));
    return tiers->ReadHome(id, dst).WithContext("zinf_tensor_read");
  });
}

ZINF_API int zinf_tensor_discard(zinf_engine* engine, uint64_t id) {
  return Guard("zinf_tensor_discard", [&]() -> zinf::Status {
    ZINF_ASSIGN_OR_RETURN(auto* tiers, zinf::capi::Tiers(engine, id, "zinf_tensor_discard"));
    return tiers->Discard(id).WithContext("zinf_tensor_discard");
  });
}

ZINF_API int zinf_acquire(zinf_engine* engine, uint64_t id, int tier, int mode,
                          uint64_t* lease) {
  return Guard("zinf_acquire",
               [&] { return zinf::capi::Acquire(engine, id, tier, mode, lease); });
}

ZINF_API int zinf_lease_wait(zinf_engine* engine, uint64_t lease, void** ptr) {
  return Guard("zinf_lease_wait", [&] { return zinf::capi::Wait(engine, lease, ptr); });
}

ZINF_API int zinf_release(zinf_engine* engine, uint64_t lease, int dirty) {
  return Guard("zinf_release", [&] { return zinf::capi::Release(engine, lease, dirty); });
}

ZINF_API int zinf_engine_end_step(zinf_engine* engine) {
  return Guard("zinf_engine_end_step", [&]() -> zinf::Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckEngine(engine, "zinf_engine_end_step"));
    std::lock_guard lock(engine->mu);
    ZINF_RETURN_IF_ERROR(zinf::capi::SealLocked(engine));
    engine->rt->tiers->EndStep();
    return zinf::Status::Ok();
  });
}

ZINF_API int zinf_engine_pause_trace(zinf_engine* engine, int paused) {
  return Guard("zinf_engine_pause_trace", [&]() -> zinf::Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckEngine(engine, "zinf_engine_pause_trace"));
    std::lock_guard lock(engine->mu);
    ZINF_RETURN_IF_ERROR(zinf::capi::SealLocked(engine));
    engine->rt->tiers->PauseTrace(paused != 0);
    return zinf::Status::Ok();
  });
}

ZINF_API int zinf_engine_flush(zinf_engine* engine) {
  return Guard("zinf_engine_flush", [&]() -> zinf::Status {
    ZINF_RETURN_IF_ERROR(zinf::capi::CheckEngine(engine, "zinf_engine_flush"));
    zinf::offload::TierManager* tiers = nullptr;
    {
      std::lock_guard lock(engine->mu);
      if (engine->rt == nullptr) return zinf::Status::Ok();
      tiers = engine->rt->tiers.get();
    }
    return tiers->Flush().WithContext("zinf_engine_flush");
  });
}

ZINF_API int zinf_engine_stats(zinf_engine* engine, const char** json) {
  return Guard("zinf_engine_stats", [&] { return zinf::capi::Stats(engine, json); });
}

ZINF_API int zinf_engine_adam_step(zinf_engine* engine, zinf_adam* adam, int64_t step, float lr,
                                   uint64_t param, const void* grad, int grad_dtype,
                                   uint64_t exp_avg, uint64_t exp_avg_sq, uint64_t param16,
                                   int param16_dtype) {
  return Guard("zinf_engine_adam_step", [&] {
    return zinf::capi::AdamStepTensors(engine, adam, step, lr, param, grad, grad_dtype, exp_avg,
                                       exp_avg_sq, param16, param16_dtype);
  });
}

}  // extern "C"
