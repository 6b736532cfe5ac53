// `zinf bench-swap`: the pipelined optimizer step over state homed on NVMe, against the two
// bounds it cannot beat — the raw engine moving the same bytes, and the CPU Adam on the same
// state in memory — each measured in the same run, alternating with the pipelined steps so a
// drifting disk treats them alike.
#include <algorithm>
#include <chrono>
#include <deque>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/cpu/adam.h"
#include "offload/optimizer_pipeline.h"
#include "offload/pinned_pool.h"
#include "offload/swap_space.h"
#include "offload/tier_manager.h"
#include "src/base/device.h"
#include "src/base/units.h"
#include "src/config/config.h"
#include "src/base/host_info.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchSwapArgs {
  std::vector<std::string> paths;
  std::string params = "128M";
  unsigned units = 32;
  std::string pinned = "256M";
  unsigned depth = 3;
  unsigned steps = 3;
  std::string engine = "auto";
  std::string block = "1M";
  unsigned qd = 32;
  int threads = 0;
  std::string grad = "bf16";
  bool json = false;
  std::string config;
  bool strict = false;
  std::string device_budget;  // default: three units' 16-bit parameters
  double h2d_gbps = 25;       // the emulated host-to-device link (PCIe 4 x16 is about 25)
  std::string trace;          // Chrome trace-event JSON
};

// Fills what the command line did not set from the config file's aio block, zinf budgets,
// pipeline depth, Adam threads and swap paths.
Status ApplyConfig(const CLI::App& cmd, BenchSwapArgs& a) {
  if (a.config.empty()) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(Config c, Config::FromFile(a.config, {.strict = a.strict}));
  auto unset = [&](const char* flag) { return cmd.count(flag) == 0; };
  if (unset("--engine")) a.engine = c.aio.engine;
  if (unset("--block")) a.block = std::to_string(c.aio.block_size);
  if (unset("--qd")) a.qd = c.aio.queue_depth;
  if (unset("--pinned-budget") && c.zinf.budgets.pinned_bytes) {
    a.pinned = std::to_string(*c.zinf.budgets.pinned_bytes);
  }
  if (unset("--depth")) a.depth = c.zinf.pipeline_depth + 1;
  if (unset("--threads")) a.threads = static_cast<int>(c.zinf.adam_threads);
  if (a.paths.empty()) {
    a.paths = c.zinf.stripe_paths;
    if (a.paths.empty() && !c.SwapDir().empty()) a.paths.push_back(c.SwapDir());
  }
  return Status::Ok();
}

double Seconds(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Runs every request, keeping the engine's queue full, and returns the wall time. Requests may
// share buffers (the raw bound moves every unit through the slabs in rotation): one that would
// touch a buffer an earlier request still in flight touches, where either of them writes the
// buffer (a read from the disk), waits for that one first, so no two transfers race on memory.
Result<double> TimedTransfer(io::Engine& engine, const std::vector<io::Request>& reqs) {
  auto t0 = Clock::now();
  struct InFlight {
    io::Ticket ticket;
    const io::Request* req;
  };
  std::deque<InFlight> flight;
  auto conflicts = [](const io::Request& a, const io::Request& b) {
    if (a.op != io::OpKind::kRead && b.op != io::OpKind::kRead) return false;
    auto* a0 = static_cast<const uint8_t*>(a.buf);
    auto* b0 = static_cast<const uint8_t*>(b.buf);
    return a0 < b0 + b.len && b0 < a0 + a.len;
  };
  Status first = Status::Ok();  // the first failure; what is in flight is still waited for
  auto wait_front = [&] {
    Status s = engine.Wait(flight.front().ticket);
    if (first.ok()) first = s;
    flight.pop_front();
  };
  for (const auto& r : reqs) {
    while (std::any_of(flight.begin(), flight.end(),
                       [&](const InFlight& f) { return conflicts(*f.req, r); })) {
      wait_front();
    }
    if (!first.ok()) break;
    auto t = engine.Submit(r);
    if (!t.ok()) {
      first = t.status();
      break;
    }
    flight.push_back({*t, &r});
  }
  while (!flight.empty()) wait_front();
  if (!first.ok()) return first;
  return Seconds(t0);
}

// The command line, parsed and checked.
struct SwapOptions {
  uint64_t params = 0, pinned = 0, block = 0;
  io::EngineKind kind = io::EngineKind::kAuto;
  kernels::DType grad_type = kernels::DType::kBf16;
};

// Applies the config, then parses and checks the flags (a failure is a usage error).
Result<SwapOptions> ParseOptions(const CLI::App& cmd, BenchSwapArgs& a) {
  ZINF_RETURN_IF_ERROR(ApplyConfig(cmd, a));
  if (a.paths.empty()) {
    return InvalidArgument("no swap directory: give --path DIR or a --config with "
                           "offload_optimizer.nvme_path or zinf.stripe_paths");
  }
  SwapOptions o;
  auto params = ParseBytes(a.params);  // a count; K/M/G suffixes are welcome
  if (!params.ok() || *params == 0) {
    return InvalidArgument("--params: expected a count such as 128M");
  }
  o.params = *params;
  auto pinned = ParseBytes(a.pinned);
  if (!pinned.ok()) return pinned.status().WithContext("--pinned-budget");
  o.pinned = *pinned;
  auto block = ParseBytes(a.block);
  if (!block.ok()) return block.status().WithContext("--block");
  o.block = *block;
  auto kind = io::ParseEngineKind(a.engine);
  if (!kind.ok()) return kind.status().WithContext("--engine");
  o.kind = *kind;
  if (a.units == 0 || a.steps == 0) return InvalidArgument("--units and --steps must be > 0");
  if (a.grad == "bf16") o.grad_type = kernels::DType::kBf16;
  else if (a.grad == "fp32") o.grad_type = kernels::DType::kF32;
  else return InvalidArgument(fmt::format("--grad '{}': expected bf16 or fp32", a.grad));
  return o;
}

// The engine, the swap file on it and the pinned pool registered with it.
struct Storage {
  std::unique_ptr<io::Engine> engine;
  std::unique_ptr<offload::SwapSpace> space;
  std::unique_ptr<offload::PinnedPool> pool;
};

Result<Storage> OpenStorage(const BenchSwapArgs& a, const SwapOptions& o, uint64_t per_unit) {
  Storage st;
  ZINF_ASSIGN_OR_RETURN(st.engine, io::Engine::Create({.kind = o.kind, .block_size = o.block,
                                                       .queue_depth = a.qd}));
  // Size the swap file for every unit's four extents, padded and stripe-aligned.
  const uint64_t unit_bytes = 14 * per_unit;
  const uint64_t swap_bytes = a.units * (unit_bytes + 4 * (8u << 20));
  ZINF_ASSIGN_OR_RETURN(st.space, offload::SwapSpace::Create(*st.engine, {.dirs = a.paths,
                                                              .name = "zinf-bench-swap.dat",
                                                              .size = swap_bytes}));
  ZINF_ASSIGN_OR_RETURN(st.pool, offload::PinnedPool::Create(
      {.budget_bytes = o.pinned, .alignment = std::max<uint32_t>(4096, st.space->mem_align())}));
  ZINF_RETURN_IF_ERROR(st.pool->RegisterWith(*st.engine));
  return st;
}

// Gradients for every unit (host memory, as backward leaves them).
std::vector<uint8_t> MakeGradients(uint64_t elems, kernels::DType grad_type, std::mt19937& rng) {
  const size_t gsize = grad_type == kernels::DType::kBf16 ? 2 : 4;
  std::vector<uint8_t> grads(elems * gsize);
  for (size_t i = 0; i < grads.size() / 2; ++i) {
    // bf16 of a small normal-ish value, or the low/high halves of fp32 ones: any finite bits do.
    uint16_t bits = static_cast<uint16_t>(0x3c00 + (rng() & 0x3ff)) ^ ((rng() & 1) << 15);
    std::memcpy(&grads[2 * i], &bits, 2);
  }
  if (grad_type == kernels::DType::kF32) {
    for (size_t i = 0; i < grads.size(); i += 4) {
      float f = static_cast<float>(static_cast<int>(rng() % 2001) - 1000) * 1e-4f;
      std::memcpy(&grads[i], &f, 4);
    }
  }
  return grads;
}

// Units and their homes in the swap space, each pointing at its slice of `grads`.
Result<std::vector<offload::OptimizerUnit>> MakeUnits(offload::SwapSpace& space, unsigned count,
                                                      uint64_t per_unit, kernels::DType grad_type,
                                                      std::vector<uint8_t>& grads) {
  std::vector<offload::OptimizerUnit> units(count);
  const size_t gsize = grad_type == kernels::DType::kBf16 ? 2 : 4;
  for (unsigned u = 0; u < count; ++u) {
    auto& x = units[u];
    x.n = per_unit;
    auto alloc = [&](uint64_t bytes) { return space.Allocate(bytes); };
    auto m = alloc(4 * per_unit), e1 = alloc(4 * per_unit), e2 = alloc(4 * per_unit),
         p = alloc(2 * per_unit);
    if (!m.ok() || !e1.ok() || !e2.ok() || !p.ok()) return Internal("swap space sizing");
    x.master = *m; x.exp_avg = *e1; x.exp_avg_sq = *e2; x.param16 = *p;
    x.grad = grads.data() + u * per_unit * gsize;
    x.grad_type = grad_type;
  }
  return units;
}

// Initial state: master random, moments zero, written home (not timed).
Status WriteInitialState(io::Engine& engine, offload::SwapSpace& space,
                         offload::OptimizerPipeline& pipe,
                         const std::vector<offload::OptimizerUnit>& units, uint64_t per_unit,
                         std::mt19937& rng) {
  const auto layout = pipe.LayoutFor(per_unit);
  const auto& slabs = pipe.slabs();
  for (auto& s : slabs) {
    auto* f = reinterpret_cast<float*>(s.data);
    for (uint64_t i = 0; i < per_unit; ++i) f[i] = static_cast<float>(rng() % 2000) * 1e-3f - 1;
    std::memset(s.data + layout.exp_avg, 0, 2 * layout.state_bytes);
  }
  std::vector<io::Request> init;
  for (unsigned u = 0; u < units.size(); ++u) {
    uint8_t* s = slabs[u % slabs.size()].data;
    init.push_back({io::OpKind::kWrite, space.file(), units[u].master.offset, s + layout.master, layout.state_bytes});
    init.push_back({io::OpKind::kWrite, space.file(), units[u].exp_avg.offset, s + layout.exp_avg, layout.state_bytes});
    init.push_back({io::OpKind::kWrite, space.file(), units[u].exp_avg_sq.offset, s + layout.exp_avg_sq, layout.state_bytes});
    init.push_back({io::OpKind::kWrite, space.file(), units[u].param16.offset, s + layout.param16, layout.param16_bytes});
  }
  return TimedTransfer(engine, init).status();
}

// The (host-emulated) device, its arena, and the tier manager with every unit's 16-bit
// parameters registered, homed on NVMe.
struct DeviceSide {
  std::unique_ptr<Device> device;
  std::unique_ptr<DeviceArena> arena;
  std::unique_ptr<offload::TierManager> tm;
  std::vector<offload::ShardId> p16;
};

Result<DeviceSide> SetUpDevice(const BenchSwapArgs& a, uint64_t dev_budget,
                               offload::PinnedPool& pool, offload::SwapSpace& space,
                               Tracer& tracer,
                               const std::vector<offload::OptimizerUnit>& units,
                               uint64_t per_unit) {
  DeviceSide d;
  ZINF_ASSIGN_OR_RETURN(d.device, MakeHostDevice({.kind = DeviceKind::kHost,
                                                   .budget_bytes = dev_budget,
                                                   .copy_gbps = a.h2d_gbps}));
  ZINF_ASSIGN_OR_RETURN(d.arena, DeviceArena::Create(*d.device));
  ZINF_ASSIGN_OR_RETURN(d.tm, offload::TierManager::Create(*d.arena, pool, &space,
                                                           {.tracer = &tracer}));
  d.p16.resize(a.units);
  for (unsigned u = 0; u < a.units; ++u) {
    ZINF_ASSIGN_OR_RETURN(d.p16[u], d.tm->Register({.name = fmt::format("unit{}.param16", u),
                                                    .unit = u, .role = offload::Role::kParam16,
                                                    .bytes = 2 * per_unit,
                                                    .home = offload::Tier::kNvme,
                                                    .home_extent = units[u].param16}));
  }
  return d;
}

// One forward/backward sweep: each unit's 16-bit parameters come up to the device through the
// tier manager, ahead of use once the trace is known. Returns the wall time.
Result<double> Sweep(offload::TierManager& tm, const std::vector<offload::ShardId>& p16) {
  const unsigned n = static_cast<unsigned>(p16.size());
  auto t0 = Clock::now();
  for (int pass = 0; pass < 2; ++pass) {  // forward, then backward
    for (unsigned k = 0; k < n; ++k) {
      unsigned u = pass == 0 ? k : n - 1 - k;
      ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(p16[u], offload::Tier::kDevice));
      auto ptr = lease.Wait();
      Status released = tm.Release(std::move(lease), false);
      if (!ptr.ok()) return ptr.status();
      ZINF_RETURN_IF_ERROR(released);
    }
  }
  return Seconds(t0);
}

// The raw bound's requests: every unit's state through the slabs in rotation, and the bytes
// they move.
struct RawRequests {
  std::vector<io::Request> reads, writes;
  uint64_t read_bytes = 0, write_bytes = 0;
};

RawRequests MakeRawRequests(const offload::SwapSpace& space, const offload::OptimizerPipeline& pipe,
                            const std::vector<offload::OptimizerUnit>& units, uint64_t per_unit) {
  const auto layout = pipe.LayoutFor(per_unit);
  const auto& slabs = pipe.slabs();
  const uint64_t n = units.size();
  RawRequests r;
  for (unsigned u = 0; u < units.size(); ++u) {
    uint8_t* s = slabs[u % slabs.size()].data;
    for (auto [ext, off] : {std::pair{&units[u].master, layout.master},
                            std::pair{&units[u].exp_avg, layout.exp_avg},
                            std::pair{&units[u].exp_avg_sq, layout.exp_avg_sq}}) {
      r.reads.push_back(
          {io::OpKind::kRead, space.file(), ext->offset, s + off, layout.state_bytes});
      r.writes.push_back(
          {io::OpKind::kWrite, space.file(), ext->offset, s + off, layout.state_bytes});
    }
    r.writes.push_back({io::OpKind::kWrite, space.file(), units[u].param16.offset,
                        s + layout.param16, layout.param16_bytes});
  }
  r.read_bytes = r.reads.size() * layout.state_bytes;
  r.write_bytes = (r.writes.size() - n) * layout.state_bytes + n * layout.param16_bytes;
  return r;
}

// What each round measured, and the last pipelined step's counters.
struct Rounds {
  std::vector<double> io_bounds, adam_bounds, steps, stalls, raw_read, raw_write, sweeps;
  offload::OptimizerStepStats last{};
};

// Runs the rounds: the two bounds, the sweep and a pipelined step each, printing a line per
// round unless --json.
Status RunRounds(const BenchSwapArgs& a, kernels::DType grad_type, io::Engine& engine,
                 offload::OptimizerPipeline& pipe, const offload::OptimizerPipelineOptions& po,
                 std::vector<offload::OptimizerUnit>& units, DeviceSide& dev,
                 const RawRequests& raw, uint64_t per_unit, Rounds& r) {
  const auto layout = pipe.LayoutFor(per_unit);
  const auto& slabs = pipe.slabs();
  kernels::AdamHyper hyper;
  hyper.lr = 1e-4f;
  hyper.adamw = true;
  hyper.weight_decay = 0.01f;
  for (unsigned s = 0; s < a.steps; ++s) {
    // Bound 1: the raw engine moving the same bytes (reads, then writes: one disk does both).
    ZINF_ASSIGN_OR_RETURN(double tr, TimedTransfer(engine, raw.reads));
    ZINF_ASSIGN_OR_RETURN(double tw, TimedTransfer(engine, raw.writes));
    r.io_bounds.push_back(tr + tw);
    r.raw_read.push_back(static_cast<double>(raw.read_bytes) / tr / 1e9);
    r.raw_write.push_back(static_cast<double>(raw.write_bytes) / tw / 1e9);
    // Bound 2: the CPU Adam on the same state in memory (the slabs, in rotation).
    auto t0 = Clock::now();
    for (unsigned u = 0; u < a.units; ++u) {
      uint8_t* sl = slabs[u % slabs.size()].data;
      kernels::AdamBuffers b{reinterpret_cast<float*>(sl + layout.master), units[u].grad,
                             grad_type, sl + layout.exp_avg, sl + layout.exp_avg_sq,
                             kernels::DType::kF32, sl + layout.param16, kernels::DType::kBf16,
                             per_unit};
      hyper.step = 1;
      ZINF_RETURN_IF_ERROR(kernels::AdamStep(hyper, b, po.adam).status());
    }
    r.adam_bounds.push_back(Seconds(t0));
    // The forward/backward sweep, then the pipelined optimizer step.
    ZINF_ASSIGN_OR_RETURN(double sw, Sweep(*dev.tm, dev.p16));
    r.sweeps.push_back(sw);
    hyper.step = s + 1;
    ZINF_ASSIGN_OR_RETURN(offload::OptimizerStepStats st, pipe.Step(units, hyper));
    // The optimizer rewrote every param16 home: cached copies are stale.
    for (auto id : dev.p16) ZINF_RETURN_IF_ERROR(dev.tm->Invalidate(id));
    dev.tm->EndStep();
    r.steps.push_back(st.seconds);
    r.stalls.push_back(st.read_wait_seconds);
    r.last = st;
    if (!a.json) {
      fmt::print(stderr, "round {}: sweep {:.3f} s | step {:.3f} s (stall {:.3f} s, adam {:.3f} s) | raw io {:.3f} s "
                 "(read {:.2f} GB/s, write {:.2f} GB/s) | adam alone {:.3f} s\n",
                 s + 1, r.sweeps.back(), st.seconds, st.read_wait_seconds, st.adam_seconds,
                 r.io_bounds.back(), r.raw_read.back(), r.raw_write.back(), r.adam_bounds.back());
    }
  }
  return Status::Ok();
}

// Prints the medians: one JSON object with --json, else a table.
void PrintSummary(const BenchSwapArgs& a, const io::Engine& engine,
                  const offload::PinnedPool& pool, const offload::OptimizerPipeline::Layout& layout,
                  const offload::TierStats& ts, const Rounds& r, uint64_t per_unit,
                  uint64_t dev_budget) {
  const double step = Median(r.steps), io_b = Median(r.io_bounds), adam_b = Median(r.adam_bounds);
  const double bound = std::max(io_b, adam_b);
  const uint64_t state_bytes = a.units * (3 * layout.state_bytes + layout.param16_bytes);
  if (a.json) {
    nlohmann::json j = {
        {"engine", std::string(engine.name())},
        {"params", per_unit * a.units},
        {"units", a.units},
        {"state_bytes", state_bytes},
        {"pinned_budget_bytes", pool.budget_bytes()},
        {"peak_pinned_bytes", ts.peak_host_bytes},
        {"pipeline_depth", a.depth},
        {"steps", a.steps},
        {"step_seconds", step},
        {"io_bound_seconds", io_b},
        {"adam_bound_seconds", adam_b},
        {"step_over_bound", step / bound},
        {"stall_seconds", Median(r.stalls)},
        {"nvme_read_bytes_per_step", r.last.bytes_read},
        {"nvme_write_bytes_per_step", r.last.bytes_written},
        {"step_read_gbps", static_cast<double>(r.last.bytes_read) / step / 1e9},
        {"step_write_gbps", static_cast<double>(r.last.bytes_written) / step / 1e9},
        {"raw_read_gbps", Median(r.raw_read)},
        {"raw_write_gbps", Median(r.raw_write)},
        {"sweep_seconds", Median(r.sweeps)},
        {"sweep_stall_seconds", ts.stall_seconds / a.steps},
        {"sweep_nvme_read_bytes", ts.nvme_read_bytes},
        {"h2d_bytes", ts.h2d_bytes},
        {"h2d_busy_seconds", ts.h2d_busy_seconds},
        {"sweep_nvme_read_busy_seconds", ts.nvme_read_busy_seconds},
        {"peak_device_bytes", ts.peak_device_bytes},
        {"device_budget_bytes", dev_budget},
        {"prefetch_hits", ts.prefetch_hits},
        {"prefetch_misses", ts.prefetch_misses}};
    fmt::print("{}\n", j.dump());
    return;
  }
  fmt::print("state on NVMe     {} ({:.1f}x the pinned budget of {}), {} units, depth {}\n",
             FormatBytesHuman(state_bytes),
             static_cast<double>(state_bytes) / static_cast<double>(pool.budget_bytes()),
             FormatBytesHuman(pool.budget_bytes()), a.units, a.depth);
  fmt::print("step (median)     {:.3f} s   stall {:.3f} s\n", step, Median(r.stalls));
  fmt::print("raw I/O bound     {:.3f} s   (read {:.2f} GB/s, write {:.2f} GB/s)\n", io_b,
             Median(r.raw_read), Median(r.raw_write));
  fmt::print("Adam bound        {:.3f} s\n", adam_b);
  fmt::print("step / bound      {:.3f}\n", step / bound);
  fmt::print("fwd+bwd sweep     {:.3f} s (median; param16 to a {} device budget at {:g} GB/s), "
             "prefetch hits {} misses {}\n", Median(r.sweeps), FormatBytesHuman(dev_budget),
             a.h2d_gbps, ts.prefetch_hits, ts.prefetch_misses);
}

int RunBenchSwap(const CLI::App& cmd, BenchSwapArgs a) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf bench-swap: {}\n", s.ToString());
    return code;
  };
  auto opts = ParseOptions(cmd, a);
  if (!opts.ok()) return fail(opts.status(), 2);
  const SwapOptions& o = *opts;

  const uint64_t per_unit = (o.params + a.units - 1) / a.units;
  auto storage = OpenStorage(a, o, per_unit);
  if (!storage.ok()) return fail(storage.status(), 1);
  io::Engine& engine = *storage->engine;
  offload::SwapSpace& space = *storage->space;
  offload::PinnedPool& pool = *storage->pool;
  Tracer tracer(!a.trace.empty());
  offload::OptimizerPipelineOptions po;
  po.depth = a.depth;
  po.tracer = &tracer;
  po.adam.threads = a.threads;
  auto pipe_r = offload::OptimizerPipeline::Create(space, pool, per_unit, po);
  if (!pipe_r.ok()) return fail(pipe_r.status(), 1);
  offload::OptimizerPipeline& pipe = **pipe_r;

  std::mt19937 rng(1);
  std::vector<uint8_t> grads = MakeGradients(per_unit * a.units, o.grad_type, rng);
  auto units_r = MakeUnits(space, a.units, per_unit, o.grad_type, grads);
  if (!units_r.ok()) return fail(units_r.status(), 1);
  std::vector<offload::OptimizerUnit>& units = *units_r;
  if (Status s = WriteInitialState(engine, space, pipe, units, per_unit, rng); !s.ok()) {
    return fail(s, 1);
  }
  // The forward/backward sweep: each unit's 16-bit parameters come up to the (host-emulated)
  // device through the tier manager, ahead of use once the trace is known.
  uint64_t dev_budget = 3 * 2 * per_unit;
  if (!a.device_budget.empty()) {
    auto d = ParseBytes(a.device_budget);
    if (!d.ok()) return fail(d.status().WithContext("--device-budget"), 2);
    dev_budget = *d;
  }
  auto dev = SetUpDevice(a, dev_budget, pool, space, tracer, units, per_unit);
  if (!dev.ok()) return fail(dev.status(), 1);

  const RawRequests raw = MakeRawRequests(space, pipe, units, per_unit);
  Rounds rounds;
  if (Status s = RunRounds(a, o.grad_type, engine, pipe, po, units, *dev, raw, per_unit, rounds);
      !s.ok()) {
    return fail(s, 1);
  }
  const offload::TierStats ts = dev->tm->stats();
  if (!a.trace.empty()) {
    if (Status ts_w = tracer.Write(a.trace); !ts_w.ok()) return fail(ts_w, 1);
    fmt::print(stderr, "wrote {} ({} events)\n", a.trace, tracer.event_count());
  }
  PrintSummary(a, engine, pool, pipe.LayoutFor(per_unit), ts, rounds, per_unit, dev_budget);
  return 0;
}

}  // namespace

void RegisterBenchSwap(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<BenchSwapArgs>();
  auto* cmd = app.add_subcommand(
      "bench-swap", "Pipelined optimizer step over state homed on NVMe, against the raw I/O and "
                    "CPU Adam bounds measured in the same run");
  cmd->add_option("--path", a->paths, "Swap directory; repeat to stripe")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--config", a->config,
                  "JSON config (DeepSpeed keys + zinf block): aio, budgets, pipeline depth, "
                  "swap paths; flags override it")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--strict", a->strict,
                "Refuse DeepSpeed keys zinf does not implement instead of warning");
  cmd->add_option("--params", a->params, "Parameters (fp32 master + Adam state + bf16 copy = 14 B each)")
      ->capture_default_str();
  cmd->add_option("--units", a->units, "Units (optimizer sub-groups)")->capture_default_str();
  cmd->add_option("--pinned-budget", a->pinned, "Pinned host memory budget")->capture_default_str();
  cmd->add_option("--depth", a->depth, "Pinned slabs in rotation (1 = serial)")->capture_default_str();
  cmd->add_option("--steps", a->steps, "Rounds (bounds and a step each); medians are reported")
      ->capture_default_str();
  cmd->add_option("--engine", a->engine, "uring, aio, posix or auto")->capture_default_str();
  cmd->add_option("--block", a->block, "I/O block size")->capture_default_str();
  cmd->add_option("--qd", a->qd, "I/O queue depth")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Adam threads (0: all cores)");
  cmd->add_option("--grad", a->grad, "Gradient type in host memory: bf16 or fp32")
      ->capture_default_str();
  cmd->add_option("--device-budget", a->device_budget,
                  "Emulated device memory budget (default: three units' 16-bit parameters)");
  cmd->add_option("--h2d-gbps", a->h2d_gbps, "Emulated host-to-device link, GB/s")
      ->capture_default_str();
  cmd->add_option("--trace", a->trace, "Write a Chrome trace-event JSON (chrome://tracing, Perfetto)");
  cmd->add_flag("--json", a->json, "One JSON object");
  cmd->callback([a, cmd, &exit_code] { exit_code = RunBenchSwap(*cmd, *a); });
}

}  // namespace zinf::tools
