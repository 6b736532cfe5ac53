// `zinf plan`: from the same config and flags as `zinf train`, the budgets and the machine's
// rates, print the bytes each tier and role will hold, the NVMe bytes a step moves, the
// predicted step time with its bound, and the placement chosen; refuse (exit 1) a run that does
// not fit, saying what would make it fit. `--json` for tools.
//
// Rates: --read-gbps / --write-gbps / --adam-ns / --compute-seconds, else a --rates file (zinf
// tune --json's output, or this command's own `rates` block), else measured here:
// - disk: a fresh file in the swap directory written then read for --probe-seconds each with
//   the config's aio block size and queue depth (the host may cache what was just written:
//   zinf tune's numbers, or given rates, are better on such a disk);
// - Adam: the CPU Adam over 16M parameters of state in memory (the moment type), median of 3;
// - compute: zinf train --profile's compute bound of 1- and 3-block copies of the model
//   (optimizer state in memory), extrapolated to its blocks;
// - link: the emulated link's rate on the host-emulated device with --h2d-gbps, else pinned
//   copies each way on the run's device (link_probe.h).
#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "io/file.h"
#include "kernels/cpu/adam.h"
#include "kernels/cpu/layer_ops.h"
#include "kernels/cuda/layer_ops.h"
#include "src/base/cuda_probe.h"
#include "src/base/host_info.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "src/ckpt/manifest.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/cpu_backend.h"
#include "src/train/executor.h"
#include "src/train/planner.h"
#include "src/train/sizing.h"
#include "src/train/trainer.h"
#include "tools/commands.h"
#include "tools/io_bench.h"
#include "tools/io_bench_target.h"
#include "tools/link_probe.h"
#include "tools/train_config.h"

namespace zinf::tools {
namespace {

struct PlanArgs {
  std::string rates;
  double read_gbps = 0, write_gbps = 0, adam_ns = 0, compute_seconds = 0, comm_gbps = 0;
  double link_gbps = 0;
  uint32_t world = 1;
  double probe_seconds = 2;
  bool json = false;
};

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Free bytes of the file system holding `dir` (or its nearest existing parent).
uint64_t FreeBytes(std::filesystem::path dir) {
  std::error_code ec;
  while (!dir.empty() && !std::filesystem::exists(dir, ec)) dir = dir.parent_path();
  struct statvfs v {};
  if (dir.empty() || ::statvfs(dir.c_str(), &v) != 0) return 0;
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

// The O_DIRECT offset alignment of a file in `dir` (an unnamed temporary one): what the swap
// file's extents are padded to. 4096 when it cannot be told.
uint64_t OffsetAlign(const std::string& dir) {
  std::filesystem::create_directories(dir);
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0) return 4096;
  const io::DirectAlignment a = io::ProbeDirectAlignment(fd, dir);
  ::close(fd);
  return a.offset > 1 ? a.offset : 4096;
}

Status ProbeDisk(const Config& c, double seconds, train::PlanRates* r) {
  std::vector<std::string> dirs = c.zinf.stripe_paths;
  if (dirs.empty()) dirs.push_back(c.SwapDir());
  for (const auto& d : dirs) std::filesystem::create_directories(d);
  ZINF_ASSIGN_OR_RETURN(auto target, IoBenchTarget::Create(dirs, 1ull << 30,
                                                           std::max<uint64_t>(c.zinf.stripe_bytes, 1 << 20),
                                                           false));
  IoBenchSpec spec;
  ZINF_ASSIGN_OR_RETURN(spec.engine, io::ParseEngineKind(c.aio.engine));
  spec.block = c.aio.block_size;
  spec.queue_depth = c.aio.queue_depth;
  spec.seconds = seconds;
  spec.pattern = IoPattern::kWrite;
  ZINF_ASSIGN_OR_RETURN(IoBenchResult w, RunIoBench(*target, spec));
  spec.pattern = IoPattern::kRead;
  ZINF_ASSIGN_OR_RETURN(IoBenchResult rd, RunIoBench(*target, spec));
  r->read_gbps = rd.gbps;
  r->write_gbps = w.gbps;
  return Status::Ok();
}

Result<double> ProbeAdam(const Config& c) {
  // The run's kernel on the run's types: its gradient shards are 16-bit with one micro-batch
  // (fp32 sums with several), its new weights 16-bit, its moments as configured (stochastic
  // rounding when bf16 asks for it). The median of 7 steps after one untimed.
  const uint64_t n = 16ull << 20;
  const kernels::DType moments = train::MomentType(c);
  const kernels::DType p16_type =
      c.precision() == Precision::kFp16 ? kernels::DType::kF16 : kernels::DType::kBf16;
  const kernels::DType grad_type =
      c.GradientAccumulationSteps() == 1 ? p16_type : kernels::DType::kF32;
  std::vector<float> p(n, 0.01f);
  std::vector<uint8_t> g(n * kernels::DTypeSize(grad_type), 0);
  std::vector<uint8_t> m(n * kernels::DTypeSize(moments), 0), v(m.size(), 0);
  std::vector<uint16_t> p16(n);
  kernels::AdamHyper hyper;
  hyper.adamw = true;
  kernels::AdamOptions ao;
  ao.threads = static_cast<int>(c.zinf.adam_threads);
  std::vector<double> t;
  for (int rep = 0; rep < 8; ++rep) {
    kernels::AdamBuffers b{p.data(), g.data(), grad_type, m.data(), v.data(), moments,
                           p16.data(), p16_type, n};
    b.stochastic_state = moments == kernels::DType::kBf16 &&
                         c.zinf.optimizer_state_rounding == "stochastic";
    hyper.step = rep + 1;
    const auto t0 = Clock::now();
    ZINF_RETURN_IF_ERROR(kernels::AdamStep(hyper, b, ao).status());
    if (rep > 0) t.push_back(Since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2] * 1e9 / static_cast<double>(n);
}

// zinf train --profile's compute bound of a copy of the model with `layers` blocks.
Result<double> ComputeOf(const Config& c, uint32_t layers) {
  train::TrainOptions o;
  o.config = c;
  o.config.zinf.model.layers = layers;
  o.config.zero.offload_optimizer.device = OffloadDevice::kCpu;
  o.config.zero.offload_param.device = OffloadDevice::kCpu;
  o.config.zinf.budgets.host_bytes.reset();
  o.config.zinf.budgets.pinned_bytes.reset();
  o.config.zinf.checkpoint = {};
  o.config.zinf.trace_file.clear();
  o.steps = 1;
  o.profile = true;
  o.synthetic_bytes = std::max<uint64_t>(1 << 16, 4ull * c.MicroBatchSize() *
                                                      c.zinf.model.seq_len *
                                                      c.GradientAccumulationSteps());
  ZINF_ASSIGN_OR_RETURN(train::TrainSummary s, train::Train(o));
  return s.compute_bound_seconds;
}

Status ProbeCompute(const Config& c, train::PlanRates* r) {
  const std::string level = "info";
  SetLogLevel("warn");
  auto one = ComputeOf(c, 1);
  auto three = one.ok() ? ComputeOf(c, 3) : one;
  SetLogLevel(level);
  ZINF_RETURN_IF_ERROR(one.status().WithContext("measuring compute on a 1-block copy"));
  ZINF_RETURN_IF_ERROR(three.status().WithContext("measuring compute on a 3-block copy"));
  const double per_block = std::max(0.0, (*three - *one) / 2);
  const double fixed = std::max(0.0, *one - per_block);
  r->compute_seconds = fixed + per_block * c.zinf.model.layers;
  return Status::Ok();
}

// With ZeRO-1 and above across ranks, every unit must give each rank a part of its state.
Status CheckChunks(const train::Model& dims, uint32_t world) {
  for (uint32_t u = 0; u < dims.units(); ++u) {
    if (ckpt::ChunkOfUnit(dims.UnitParams(u), world, world - 1).len == 0) {
      return InvalidArgument(fmt::format(
          "{} has {} parameters: too few to give each of {} ranks a part of its optimizer "
          "state (ZeRO-1); use fewer ranks or stage 0", dims.UnitName(u), dims.UnitParams(u),
          world));
    }
  }
  return Status::Ok();
}

// The planner's inputs from the config: the shapes, the budgets, the executor's device buffers
// and the swap directories' free bytes and alignment.
void FillPlanInputs(const Config& c, const PlanArgs& pa, bool state_nvme, train::PlanInputs& in) {
  const train::Model& dims = in.dims;
  in.batch = static_cast<int>(c.MicroBatchSize());
  in.seq = static_cast<int>(c.zinf.model.seq_len);
  in.micro_batches = static_cast<uint32_t>(c.GradientAccumulationSteps());
  in.state_generations = state_nvme && !c.zinf.checkpoint.dir.empty() ? c.zinf.checkpoint.keep + 1 : 1;
  in.device_budget = DeviceBudgetOf(c);
  // The executor's device buffers, as it sizes them (the CPU kernels' attention scratch), and
  // on a GPU the CUDA backend's cuBLAS workspace and per-row loss gradient (its attention
  // scratch may differ a little from the CPU kernels').
  uint64_t gathered = 0;
  if (pa.world > 1 && c.Stage() >= 3) {
    for (uint32_t u = 0; u < dims.units(); ++u) {
      gathered = std::max<uint64_t>(gathered, ckpt::ChunkOfUnit(dims.UnitParams(u), pa.world, 0).per);
    }
    gathered *= pa.world;
  }
  const int mb = static_cast<int>(c.MicroBatchSize()), seq = static_cast<int>(c.zinf.model.seq_len);
  in.device_reserved = train::DeviceBufferBytes(
      dims, mb, seq,
      dims.LayerScratchElems(*train::MakeCpuBackend<float>(), mb, seq), gathered);
  train::ExecutorOptions eo;
  eo.optimizer_on_nvme = state_nvme;
  eo.pipeline_slabs = c.zinf.pipeline_depth + 1;
  eo.micro_batches = in.micro_batches;
  eo.moment_type = train::MomentType(c);
  eo.sizing_world = pa.world;
  eo.partition_optimizer = pa.world > 1 && c.Stage() >= 1;
  eo.partition_grads = pa.world > 1 && c.Stage() >= 2;
  eo.partition_params = pa.world > 1 && c.Stage() >= 3;
  in.pinned_budget = train::AutoPinnedBudget(dims, c, eo);
  std::vector<std::string> dirs = c.zinf.stripe_paths;
  if (dirs.empty()) dirs.push_back(c.SwapDir());
  for (const auto& d : dirs) in.swap_free_bytes += FreeBytes(d);
  const bool swap_used = state_nvme || c.zero.offload_param.device == OffloadDevice::kNvme;
  if (swap_used) in.align = OffsetAlign(dirs[0]);
}

// The --rates file's object (its `rates` block when it is this command's own --json); null
// without --rates.
Result<nlohmann::json> ReadRatesFile(const std::string& path) {
  nlohmann::json file;
  if (path.empty()) return file;
  std::ifstream f(path);
  if (!f) return InvalidArgument("--rates " + path + ": cannot open the file");
  file = nlohmann::json::parse(f, nullptr, false);
  if (file.is_discarded() || !file.is_object()) {
    return InvalidArgument("--rates " + path + ": expected a JSON object");
  }
  if (file.contains("rates")) file = file["rates"];  // this command's own --json
  return file;
}

// The rates given by flags, else by the file; their names go to `given`.
void TakeGivenRates(const PlanArgs& pa, nlohmann::json& file, train::PlanRates& rates,
                    std::vector<std::string>& given) {
  auto take = [&](double flag, const char* key, double* out) {
    if (flag > 0) {
      *out = flag;
      given.push_back(key);
    } else if (file.contains(key) && file[key].is_number() && file[key].get<double>() > 0) {
      *out = file[key].get<double>();
      given.push_back(key);
    }
  };
  take(pa.read_gbps, "read_gbps", &rates.read_gbps);
  take(pa.write_gbps, "write_gbps", &rates.write_gbps);
  take(pa.adam_ns, "adam_ns_per_param", &rates.adam_ns_per_param);
  take(pa.compute_seconds, "compute_seconds", &rates.compute_seconds);
  take(pa.comm_gbps, "comm_gbps", &rates.comm_gbps);
  if (pa.link_gbps > 0) {
    rates.link_h2d_gbps = rates.link_d2h_gbps = pa.link_gbps;
    given.push_back("link_gbps");
  } else {
    take(0, "link_h2d_gbps", &rates.link_h2d_gbps);
    take(0, "link_d2h_gbps", &rates.link_d2h_gbps);
    // One direction given: the other the same (a link's two directions are alike).
    if (rates.link_h2d_gbps <= 0) rates.link_h2d_gbps = rates.link_d2h_gbps;
    if (rates.link_d2h_gbps <= 0) rates.link_d2h_gbps = rates.link_h2d_gbps;
  }
}

// Measures the rates neither given nor in the file: the link, the disk (when the run swaps),
// the Adam and the compute.
Status MeasureRates(const Config& c, const TrainArgs& a, const PlanArgs& pa, DeviceKind kind,
                    bool host_device, uint64_t device_budget, train::PlanRates& rates,
                    std::vector<std::string>& given, std::vector<std::string>& measured) {
  if ((rates.link_h2d_gbps <= 0 || rates.link_d2h_gbps <= 0) && host_device && a.h2d_gbps > 0) {
    // The host-emulated device's link, as zinf train will pace it.
    rates.link_h2d_gbps = rates.link_d2h_gbps = a.h2d_gbps;
    given.push_back("link (--h2d-gbps)");
  }
  if (rates.link_h2d_gbps <= 0 || rates.link_d2h_gbps <= 0) {
    DeviceOptions dopt;
    dopt.kind = kind;
    dopt.budget_bytes = device_budget;
    dopt.copy_gbps = a.h2d_gbps;
    auto link = [&]() -> Result<LinkRates> {
      ZINF_ASSIGN_OR_RETURN(auto device, MakeDevice(dopt));
      return ProbeLink(*device);
    }();
    if (!link.ok()) {
      return link.status().WithContext("measuring the link (or give its rate: --link-gbps)");
    }
    rates.link_h2d_gbps = link->h2d_gbps;
    rates.link_d2h_gbps = link->d2h_gbps;
    measured.push_back("link");
  }
  const bool state_nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  const bool uses_swap = state_nvme || c.zero.offload_param.device == OffloadDevice::kNvme;
  if (uses_swap && (rates.read_gbps <= 0 || rates.write_gbps <= 0)) {
    ZINF_RETURN_IF_ERROR(ProbeDisk(c, pa.probe_seconds, &rates));
    measured.push_back("disk");
  }
  if (rates.adam_ns_per_param <= 0) {
    ZINF_ASSIGN_OR_RETURN(rates.adam_ns_per_param, ProbeAdam(c));
    measured.push_back("Adam");
  }
  if (rates.compute_seconds <= 0) {
    ZINF_RETURN_IF_ERROR(ProbeCompute(c, &rates));
    measured.push_back("compute");
  }
  return Status::Ok();
}

// Prints the plan (and the proposal, if any): JSON with --json, else text.
void PrintPlan(const PlanArgs& pa, const train::Model& dims, const train::Plan& plan,
               const train::PlanRates& rates, const std::optional<train::Plan>& proposal,
               uint64_t proposed_host) {
  nlohmann::json j = plan.ToJson();
  j["rates"] = {{"read_gbps", rates.read_gbps},
                {"write_gbps", rates.write_gbps},
                {"adam_ns_per_param", rates.adam_ns_per_param},
                {"compute_seconds", rates.compute_seconds},
                {"comm_gbps", rates.comm_gbps},
                {"link_h2d_gbps", rates.link_h2d_gbps},
                {"link_d2h_gbps", rates.link_d2h_gbps},
                {"compute_on_host", rates.compute_on_host},
                {"source", rates.source}};
  if (proposal) {
    j["proposal"] = {{"host_bytes", proposed_host}, {"plan", proposal->ToJson()}};
  }
  if (pa.json) {
    fmt::print("{}\n", j.dump(2));
    return;
  }
  fmt::print("{}", train::FormatPlan(plan, dims));
  fmt::print("rates  : NVMe read {:.3f} GB/s, write {:.3f} GB/s; Adam {:.3f} ns a parameter; "
             "compute {:.2f} s a step; link {:.2f} GB/s to the device, {:.2f} back ({})\n",
             rates.read_gbps, rates.write_gbps, rates.adam_ns_per_param, rates.compute_seconds,
             rates.link_h2d_gbps, rates.link_d2h_gbps, rates.source);
  if (proposal) {
    fmt::print("proposal: --host-budget {}: {}; NVMe read {} written {} a step, step {:.2f} s "
               "({:.2f}x), bound by {}\n",
               FormatBytesShort(proposed_host), proposal->placement.Describe(dims),
               FormatBytesHuman(static_cast<uint64_t>(proposal->nvme_read_per_step)),
               FormatBytesHuman(static_cast<uint64_t>(proposal->nvme_write_per_step)),
               proposal->step_seconds,
               plan.step_seconds > 0 ? proposal->step_seconds / plan.step_seconds : 0,
               proposal->bound);
  }
}

int RunPlan(const CLI::App& cmd, const TrainArgs& a, const PlanArgs& pa) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf plan: {}\n", s.ToString());
    return code;
  };
  auto cfg = BuildTrainConfig(cmd, a);
  if (!cfg.ok()) return fail(cfg.status(), 2);
  Config& c = cfg->config;
  auto model = train::Model::FromConfig(c.zinf.model);
  if (!model.ok()) return fail(model.status(), 2);
  const train::Model& dims = *model;
  const bool state_nvme = c.zero.offload_optimizer.device == OffloadDevice::kNvme;
  const uint64_t per_param = train::StateBytesPerParam(c);

  train::PlanInputs in;
  in.dims = dims;
  in.world = pa.world;
  const bool chunked = pa.world > 1 && c.Stage() >= 1;
  if (chunked) {
    if (Status s = CheckChunks(dims, pa.world); !s.ok()) return fail(s, 1);
  }
  FillPlanInputs(c, pa, state_nvme, in);
  // Rank 0's share of the memory available: the ranks on this machine split it, as zinf train
  // does (by LOCAL_WORLD_SIZE).
  const uint64_t available = MemAvailableBytes() / pa.world;
  // zinf.budgets.host_bytes "auto": what zinf train would size it to now.
  if (c.zinf.budgets.host_bytes_auto && state_nvme && available > 0) {
    c.zinf.budgets.host_bytes = train::AutoHostBytes(available, in.pinned_budget, in.device_budget);
  }
  // Rank 0's chunks across ranks (the largest), as zinf train places each rank's own.
  auto state_elems = [&](uint32_t u) {
    const uint64_t n = dims.UnitParams(u);
    return chunked ? ckpt::ChunkOfUnit(n, pa.world, 0).len : n;
  };
  auto placement = train::PlaceOptimizerState(
      dims, c, a.placement, per_param, state_elems,
      available > in.pinned_budget ? available - in.pinned_budget : 1);
  if (!placement.ok()) return fail(placement.status(), 1);

  // Rates: flags, then the file, then measured.
  train::PlanRates rates;
  std::vector<std::string> measured, given;
  auto file = ReadRatesFile(pa.rates);
  if (!file.ok()) return fail(file.status(), 2);
  TakeGivenRates(pa, *file, rates, given);
  auto kind = ParseDeviceKind(a.device);
  if (!kind.ok()) return fail(kind.status().WithContext("--device"), 2);
  const bool host_device =
      *kind == DeviceKind::kHost || (*kind == DeviceKind::kAuto && ProbeCuda().device_count == 0);
  if (!host_device) {
    const int mb = static_cast<int>(c.MicroBatchSize()), seq = static_cast<int>(c.zinf.model.seq_len);
    in.device_reserved += kernels::cuda::kCublasWorkspaceBytes +
                          (static_cast<uint64_t>(mb) * seq * 4 + kDeviceAlignment - 1) /
                              kDeviceAlignment * kDeviceAlignment;
  }
  if (Status s = MeasureRates(c, a, pa, *kind, host_device, in.device_budget, rates, given,
                              measured);
      !s.ok()) {
    return fail(s, 1);
  }
  rates.compute_on_host = host_device;
  rates.source = fmt::format("{}{}{}", given.empty() ? "" : "given: " + fmt::format("{}", fmt::join(given, ", ")),
                             !given.empty() && !measured.empty() ? "; " : "",
                             measured.empty() ? "" : "measured here: " + fmt::format("{}", fmt::join(measured, ", ")));
  const train::Plan plan = train::PlanRun(c, in, *placement, rates);

  // With the state on NVMe and no host budget: what a budget of the memory this machine has
  // to spare would give (the planner's proposal).
  std::optional<train::Plan> proposal;
  uint64_t proposed_host = 0;
  if (state_nvme && !c.zinf.budgets.host_bytes && a.placement == "auto") {
    // What --host-budget auto would give (zinf train sizes it the same way).
    proposed_host = train::AutoHostBytes(available, in.pinned_budget, in.device_budget);
    if (proposed_host >= (1ull << 30)) {
      Config pc = c;
      pc.zinf.budgets.host_bytes = proposed_host;
      auto pp = train::PlaceOptimizerState(dims, pc, "auto", per_param, state_elems,
                                           available - in.pinned_budget);
      if (pp.ok() && pp->memory_bytes > 0) proposal = train::PlanRun(pc, in, *pp, rates);
    }
  }
  PrintPlan(pa, dims, plan, rates, proposal, proposed_host);
  return plan.fits ? 0 : 1;
}

}  // namespace

void RegisterPlan(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TrainArgs>();
  auto pa = std::make_shared<PlanArgs>();
  auto* cmd = app.add_subcommand(
      "plan", "Before a run: the bytes each tier will hold, the NVMe bytes a step moves, the "
              "predicted step time and its bound, from the same config and flags as zinf train");
  AddTrainFlags(cmd, a.get());
  cmd->add_option("--rates", pa->rates,
                  "JSON with read_gbps, write_gbps (zinf tune --json's output), "
                  "adam_ns_per_param, compute_seconds, link_h2d_gbps, link_d2h_gbps (any of "
                  "them; the rest are measured)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--read-gbps", pa->read_gbps, "NVMe read rate, GB/s");
  cmd->add_option("--write-gbps", pa->write_gbps, "NVMe write rate, GB/s");
  cmd->add_option("--adam-ns", pa->adam_ns, "CPU Adam, ns a parameter");
  cmd->add_option("--compute-seconds", pa->compute_seconds,
                  "Forward + backward of a step, seconds");
  cmd->add_option("--link-gbps", pa->link_gbps,
                  "Host <-> device link, GB/s each way (16-bit weights to the device, gradients "
                  "back); default: --h2d-gbps on the host-emulated device, else measured");
  cmd->add_option("--world", pa->world,
                  "Ranks on this machine (zinf launch --nproc), each holding its share by the "
                  "ZeRO stage; the plan is rank 0's, the time the machine's")
      ->check(CLI::Range(1u, 4096u))
      ->capture_default_str();
  cmd->add_option("--comm-gbps", pa->comm_gbps,
                  "Across ranks: a rank's collectives, GB/s sent (zinf bench-comm's bus GB/s); "
                  "without it the collectives' time is not counted");
  cmd->add_option("--probe-seconds", pa->probe_seconds,
                  "Seconds of each disk probe (write, then read)")
      ->capture_default_str();
  cmd->add_flag("--json", pa->json, "Print the plan as JSON");
  cmd->callback([a, pa, cmd, &exit_code] { exit_code = RunPlan(*cmd, *a, *pa); });
}

}  // namespace zinf::tools
