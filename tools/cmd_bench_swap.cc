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

int RunBenchSwap(const CLI::App& cmd, BenchSwapArgs a) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf bench-swap: {}\n", s.ToString());
    return code;
  };
  if (Status s = ApplyConfig(cmd, a); !s.ok()) return fail(s, 2);
  if (a.paths.empty()) {
    return fail(InvalidArgument("no swap directory: give --path DIR or a --config with "
                                "offload_optimizer.nvme_path or zinf.stripe_paths"), 2);
  }
  auto params = ParseBytes(a.params);  // a count; K/M/G suffixes are welcome
  if (!params.ok() || *params == 0) return fail(InvalidArgument("--params: expected a count such as 128M"), 2);
  auto pinned = ParseBytes(a.pinned);
  if (!pinned.ok()) return fail(pinned.status().WithContext("--pinned-budget"), 2);
  auto block = ParseBytes(a.block);
  if (!block.ok()) return fail(block.status().WithContext("--block"), 2);
  auto kind = io::ParseEngineKind(a.engine);
  if (!kind.ok()) return fail(kind.status().WithContext("--engine"), 2);
  if (a.units == 0 || a.steps == 0) return fail(InvalidArgument("--units and --steps must be > 0"), 2);
  kernels::DType grad_type;
  if (a.grad == "bf16") grad_type = kernels::DType::kBf16;
  else if (a.grad == "fp32") grad_type = kernels::DType::kF32;
  else return fail(InvalidArgument(fmt::format("--grad '{}': expected bf16 or fp32", a.grad)), 2);

  const uint64_t per_unit = (*params + a.units - 1) / a.units;
  auto engine_r = io::Engine::Create({.kind = *kind, .block_size = *block, .queue_depth = a.qd});
  if (!engine_r.ok()) return fail(engine_r.status(), 1);
  io::Engine& engine = **engine_r;

  // Size the swap file for every unit's four extents, padded and stripe-aligned.
  const uint64_t unit_bytes = 14 * per_unit;
  const uint64_t swap_bytes = a.units * (unit_bytes + 4 * (8u << 20));
  auto space_r = offload::SwapSpace::Create(
      engine, {.dirs = a.paths, .name = "zinf-bench-swap.dat", .size = swap_bytes});
  if (!space_r.ok()) return fail(space_r.status(), 1);
  offload::SwapSpace& space = **space_r;
  auto pool_r = offload::PinnedPool::Create(
      {.budget_bytes = *pinned, .alignment = std::max<uint32_t>(4096, space.mem_align())});
  if (!pool_r.ok()) return fail(pool_r.status(), 1);
  offload::PinnedPool& pool = **pool_r;
  if (Status s = pool.RegisterWith(engine); !s.ok()) return fail(s, 1);
  Tracer tracer(!a.trace.empty());
  offload::OptimizerPipelineOptions po;
  po.depth = a.depth;
  po.tracer = &tracer;
  po.adam.threads = a.threads;
  auto pipe_r = offload::OptimizerPipeline::Create(space, pool, per_unit, po);
  if (!pipe_r.ok()) return fail(pipe_r.status(), 1);
  offload::OptimizerPipeline& pipe = **pipe_r;

  // Units, their homes, their gradients (host memory, as backward leaves them).
  std::vector<offload::OptimizerUnit> units(a.units);
  const size_t gsize = grad_type == kernels::DType::kBf16 ? 2 : 4;
  std::vector<uint8_t> grads(per_unit * a.units * gsize);
  std::mt19937 rng(1);
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
  for (unsigned u = 0; u < a.units; ++u) {
    auto& x = units[u];
    x.n = per_unit;
    auto alloc = [&](uint64_t bytes) { return space.Allocate(bytes); };
    auto m = alloc(4 * per_unit), e1 = alloc(4 * per_unit), e2 = alloc(4 * per_unit),
         p = alloc(2 * per_unit);
    if (!m.ok() || !e1.ok() || !e2.ok() || !p.ok()) return fail(Internal("swap space sizing"), 1);
    x.master = *m; x.exp_avg = *e1; x.exp_avg_sq = *e2; x.param16 = *p;
    x.grad = grads.data() + u * per_unit * gsize;
    x.grad_type = grad_type;
  }
  const auto layout = pipe.LayoutFor(per_unit);
  const auto& slabs = pipe.slabs();
  // Initial state: master random, moments zero, written home (not timed).
  {
    for (auto& s : slabs) {
      auto* f = reinterpret_cast<float*>(s.data);
      for (uint64_t i = 0; i < per_unit; ++i) f[i] = static_cast<float>(rng() % 2000) * 1e-3f - 1;
      std::memset(s.data + layout.exp_avg, 0, 2 * layout.state_bytes);
    }
    std::vector<io::Request> init;
    for (unsigned u = 0; u < a.units; ++u) {
      uint8_t* s = slabs[u % slabs.size()].data;
      init.push_back({io::OpKind::kWrite, space.file(), units[u].master.offset, s + layout.master, layout.state_bytes});
      init.push_back({io::OpKind::kWrite, space.file(), units[u].exp_avg.offset, s + layout.exp_avg, layout.state_bytes});
      init.push_back({io::OpKind::kWrite, space.file(), units[u].exp_avg_sq.offset, s + layout.exp_avg_sq, layout.state_bytes});
      init.push_back({io::OpKind::kWrite, space.file(), units[u].param16.offset, s + layout.param16, layout.param16_bytes});
    }
    auto t = TimedTransfer(engine, init);
    if (!t.ok()) return fail(t.status(), 1);
  }
  // The forward/backward sweep: each unit's 16-bit parameters come up to the (host-emulated)
  // device through the tier manager, ahead of use once the trace is known.
  uint64_t dev_budget = 3 * 2 * per_unit;
  if (!a.device_budget.empty()) {
    auto d = ParseBytes(a.device_budget);
    if (!d.ok()) return fail(d.status().WithContext("--device-budget"), 2);
    dev_budget = *d;
  }
  auto device_r = MakeHostDevice({.kind = DeviceKind::kHost, .budget_bytes = dev_budget,
                                  .copy_gbps = a.h2d_gbps});
  if (!device_r.ok()) return fail(device_r.status(), 1);
  auto arena_r = DeviceArena::Create(**device_r);
  if (!arena_r.ok()) return fail(arena_r.status(), 1);
  auto tm_r = offload::TierManager::Create(**arena_r, pool, &space, {.tracer = &tracer});
  if (!tm_r.ok()) return fail(tm_r.status(), 1);
  offload::TierManager& tm = **tm_r;
  std::vector<offload::ShardId> p16(a.units);
  for (unsigned u = 0; u < a.units; ++u) {
    auto id = tm.Register({.name = fmt::format("unit{}.param16", u), .unit = u,
                           .role = offload::Role::kParam16, .bytes = 2 * per_unit,
                           .home = offload::Tier::kNvme, .home_extent = units[u].param16});
    if (!id.ok()) return fail(id.status(), 1);
    p16[u] = *id;
  }
  auto sweep = [&]() -> Result<double> {
    auto t0 = Clock::now();
    for (int pass = 0; pass < 2; ++pass) {  // forward, then backward
      for (unsigned k = 0; k < a.units; ++k) {
        unsigned u = pass == 0 ? k : a.units - 1 - k;
        ZINF_ASSIGN_OR_RETURN(offload::Lease lease, tm.Acquire(p16[u], offload::Tier::kDevice));
        auto ptr = lease.Wait();
        Status released = tm.Release(std::move(lease), false);
        if (!ptr.ok()) return ptr.status();
        ZINF_RETURN_IF_ERROR(released);
      }
    }
    return Seconds(t0);
  };

  std::vector<io::Request> reads, writes;
  for (unsigned u = 0; u < a.units; ++u) {
    uint8_t* s = slabs[u % slabs.size()].data;
    for (auto [ext, off] : {std::pair{&units[u].master, layout.master},
                            std::pair{&units[u].exp_avg, layout.exp_avg},
                            std::pair{&units[u].exp_avg_sq, layout.exp_avg_sq}}) {
      reads.push_back({io::OpKind::kRead, space.file(), ext->offset, s + off, layout.state_bytes});
      writes.push_back({io::OpKind::kWrite, space.file(), ext->offset, s + off, layout.state_bytes});
    }
    writes.push_back({io::OpKind::kWrite, space.file(), units[u].param16.offset,
                      s + layout.param16, layout.param16_bytes});
  }
  const uint64_t read_bytes = reads.size() * layout.state_bytes;
  const uint64_t write_bytes = (writes.size() - a.units) * layout.state_bytes +
                               a.units * layout.param16_bytes;

  kernels::AdamHyper hyper;
  hyper.lr = 1e-4f;
  hyper.adamw = true;
  hyper.weight_decay = 0.01f;
  std::vector<double> io_bounds, adam_bounds, steps, stalls, raw_read, raw_write, sweeps;
  offload::OptimizerStepStats last{};
  for (unsigned s = 0; s < a.steps; ++s) {
    // Bound 1: the raw engine moving the same bytes (reads, then writes: one disk does both).
    auto tr = TimedTransfer(engine, reads);
    if (!tr.ok()) return fail(tr.status(), 1);
    auto tw = TimedTransfer(engine, writes);
    if (!tw.ok()) return fail(tw.status(), 1);
    io_bounds.push_back(*tr + *tw);
    raw_read.push_back(static_cast<double>(read_bytes) / *tr / 1e9);
    raw_write.push_back(static_cast<double>(write_bytes) / *tw / 1e9);
    // Bound 2: the CPU Adam on the same state in memory (the slabs, in rotation).
    auto t0 = Clock::now();
    for (unsigned u = 0; u < a.units; ++u) {
      uint8_t* sl = slabs[u % slabs.size()].data;
      kernels::AdamBuffers b{reinterpret_cast<float*>(sl + layout.master), units[u].grad,
                             grad_type, sl + layout.exp_avg, sl + layout.exp_avg_sq,
                             kernels::DType::kF32, sl + layout.param16, kernels::DType::kBf16,
                             per_unit};
      hyper.step = 1;
      auto r = kernels::AdamStep(hyper, b, po.adam);
      if (!r.ok()) return fail(r.status(), 1);
    }
    adam_bounds.push_back(Seconds(t0));
    // The forward/backward sweep, then the pipelined optimizer step.
    auto sw = sweep();
    if (!sw.ok()) return fail(sw.status(), 1);
    sweeps.push_back(*sw);
    hyper.step = s + 1;
    auto st = pipe.Step(units, hyper);
    if (!st.ok()) return fail(st.status(), 1);
    // The optimizer rewrote every param16 home: cached copies are stale.
    for (auto id : p16) {
      if (Status inv = tm.Invalidate(id); !inv.ok()) return fail(inv, 1);
    }
    tm.EndStep();
    steps.push_back(st->seconds);
    stalls.push_back(st->read_wait_seconds);
    last = *st;
    if (!a.json) {
      fmt::print(stderr, "round {}: sweep {:.3f} s | step {:.3f} s (stall {:.3f} s, adam {:.3f} s) | raw io {:.3f} s "
                 "(read {:.2f} GB/s, write {:.2f} GB/s) | adam alone {:.3f} s\n",
                 s + 1, sweeps.back(), st->seconds, st->read_wait_seconds, st->adam_seconds, io_bounds.back(),
                 raw_read.back(), raw_write.back(), adam_bounds.back());
    }
  }
  const double step = Median(steps), io_b = Median(io_bounds), adam_b = Median(adam_bounds);
  const offload::TierStats ts = tm.stats();
  const double bound = std::max(io_b, adam_b);
  const uint64_t state_bytes = a.units * (3 * layout.state_bytes + layout.param16_bytes);
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
      {"stall_seconds", Median(stalls)},
      {"nvme_read_bytes_per_step", last.bytes_read},
      {"nvme_write_bytes_per_step", last.bytes_written},
      {"step_read_gbps", static_cast<double>(last.bytes_read) / step / 1e9},
      {"step_write_gbps", static_cast<double>(last.bytes_written) / step / 1e9},
      {"raw_read_gbps", Median(raw_read)},
      {"raw_write_gbps", Median(raw_write)},
      {"sweep_seconds", Median(sweeps)},
      {"sweep_stall_seconds", ts.stall_seconds / a.steps},
      {"sweep_nvme_read_bytes", ts.nvme_read_bytes},
      {"h2d_bytes", ts.h2d_bytes},
      {"h2d_busy_seconds", ts.h2d_busy_seconds},
      {"sweep_nvme_read_busy_seconds", ts.nvme_read_busy_seconds},
      {"peak_device_bytes", ts.peak_device_bytes},
      {"device_budget_bytes", dev_budget},
      {"prefetch_hits", ts.prefetch_hits},
      {"prefetch_misses", ts.prefetch_misses}};
  if (!a.trace.empty()) {
    if (Status ts_w = tracer.Write(a.trace); !ts_w.ok()) return fail(ts_w, 1);
    fmt::print(stderr, "wrote {} ({} events)\n", a.trace, tracer.event_count());
  }
  if (a.json) {
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("state on NVMe     {} ({:.1f}x the pinned budget of {}), {} units, depth {}\n",
               FormatBytesHuman(state_bytes),
               static_cast<double>(state_bytes) / static_cast<double>(pool.budget_bytes()),
               FormatBytesHuman(pool.budget_bytes()), a.units, a.depth);
    fmt::print("step (median)     {:.3f} s   stall {:.3f} s\n", step, Median(stalls));
    fmt::print("raw I/O bound     {:.3f} s   (read {:.2f} GB/s, write {:.2f} GB/s)\n", io_b,
               Median(raw_read), Median(raw_write));
    fmt::print("Adam bound        {:.3f} s\n", adam_b);
    fmt::print("step / bound      {:.3f}\n", step / bound);
    fmt::print("fwd+bwd sweep     {:.3f} s (median; param16 to a {} device budget at {:g} GB/s), "
               "prefetch hits {} misses {}\n", Median(sweeps), FormatBytesHuman(dev_budget),
               a.h2d_gbps, ts.prefetch_hits, ts.prefetch_misses);
  }
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
