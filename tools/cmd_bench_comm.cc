// `zinf bench-comm`: the collectives' throughput, zinf's Communicator against the transport's own
// algorithms on the same connections, side by side and alternating, at sizes from 1 MiB to
// 256 MiB of fp32: over Gloo (--backend gloo) Gloo's ring all-reduce, ring all-gather and
// halving-doubling reduce-scatter on the same TCP pairs; over NCCL (--backend nccl, one GPU a
// rank) NCCL's own collectives on the same communicator, staged from and to host memory as
// zinf's are.
// Run it under `zinf launch --nproc N -- zinf bench-comm`. Each result is the median over
// --reps of the slowest rank's time (a barrier before each timing); bus bandwidth as
// nccl-tests computes it (all-reduce: size/time × 2(w-1)/w; the others: × (w-1)/w). Each
// zinf result is checked against the exact sum once per size. Rank 0 prints the table (or
// JSON); exit 1 on a failure, 2 on bad usage.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/units.h"
#include "src/base/cuda_probe.h"
#include "src/comm/gloo_transport.h"
#include "src/comm/nccl_transport.h"
#include "src/comm/p2p_communicator.h"
#include "src/comm/world.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

using comm::DType;

struct BenchCommArgs {
  std::string sizes = "1MiB,4MiB,16MiB,64MiB,256MiB";
  int reps = 5;
  bool json = false;
  bool no_gloo = false;  // no baseline
  std::string backend = "gloo";
  bool vs_handoff = false;
  std::string piece = "4MiB";
  unsigned depth = comm::CommOptions{}.pipeline_depth;
};

struct Timing {
  std::vector<double> zinf, gloo;  // the slowest rank's seconds, per rep
  std::vector<double> handoff;     // zinf with every operation on the communicator's thread
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int Fail(const Status& s) {
  fmt::print(stderr, "zinf bench-comm: {}\n", s.ToString());
  return 1;
}

// What every measurement needs: the options, the communicator and its transport.
struct Bench {
  const BenchCommArgs& a;
  comm::Communicator& c;
  comm::P2PCommunicator& p2p;
  comm::Transport& raw;
  bool nccl;
  std::string base;  // the baseline's name
  int w, rank;
  bool lead;
};

// The slowest rank's time of fn, after a barrier.
template <typename Fn>
Status TimedSlowest(const Bench& b, Fn&& fn, double* secs) {
  ZINF_RETURN_IF_ERROR(b.c.Barrier().Wait());
  const auto t0 = std::chrono::steady_clock::now();
  ZINF_RETURN_IF_ERROR(fn());
  double mine = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> all(static_cast<size_t>(b.w));
  ZINF_RETURN_IF_ERROR(b.c.AllGather(&mine, all.data(), 1, DType::kF64).Wait());
  *secs = *std::max_element(all.begin(), all.end());
  return Status::Ok();
}

// One size's buffers: n fp32 elements, per = n / world a rank.
struct SizeBuffers {
  uint64_t size;
  size_t n, per;
  std::vector<float> buf, out;
  std::function<Status()> gloo_rs;  // Gloo's prepared reduce-scatter (not over NCCL)
};

// One rep of zinf's `name`, then (--vs-handoff) zinf with every operation run on its own
// thread; the first rep's result is checked against the exact sum.
Status TimeZinf(const Bench& b, const std::string& name, SizeBuffers& s, int rep, Timing& t) {
  const size_t n = s.n, per = s.per;
  const float want = float(b.w) * float(b.w + 1) / 2;  // Σ (rank + 1)
  double secs = 0;
  for (const bool handoff : {false, true}) {
    if (handoff && !b.a.vs_handoff) break;
    b.p2p.set_waiter_runs(!handoff);
    std::fill(s.buf.begin(), s.buf.end(), float(b.rank + 1));
    Status st = TimedSlowest(b, [&] {
      if (name == "all_reduce")
        return b.c.AllReduce(s.buf.data(), DType::kF32, s.buf.data(), DType::kF32, n).Wait();
      if (name == "reduce_scatter")
        return b.c.ReduceScatter(s.buf.data(), DType::kF32, s.out.data(), DType::kF32, per)
            .Wait();
      return b.c.AllGather(s.buf.data() + size_t(b.rank) * per, s.out.data(), per, DType::kF32)
          .Wait();
    }, &secs);
    b.p2p.set_waiter_runs(true);
    ZINF_RETURN_IF_ERROR(st);
    (handoff ? t.handoff : t.zinf).push_back(secs);
    if (rep > 0) continue;
    const float* got = name == "all_reduce" ? s.buf.data() : s.out.data();
    const size_t m = name == "reduce_scatter" ? per : n;
    for (size_t i = 0; i < m; ++i) {
      const float expect =
          name == "all_gather" ? float(i / per + 1) : want;  // rank p's chunk holds p+1
      if (got[i] != expect)
        return Internal(fmt::format("{} of {}: element {} is {}, expected {}", name,
                                    FormatBytesHuman(s.size), i, got[i], expect));
    }
  }
  return Status::Ok();
}

// One rep of the transport's own `name`.
Status TimeBaseline(const Bench& b, const std::string& name, SizeBuffers& s, Timing& t) {
  const size_t n = s.n, per = s.per;
  double secs = 0;
  std::fill(s.buf.begin(), s.buf.end(), float(b.rank + 1));
  ZINF_RETURN_IF_ERROR(TimedSlowest(b, [&] {
    float* mine = s.buf.data() + size_t(b.rank) * per;
    if (b.nccl) {
      if (name == "all_reduce") return comm::NcclRaw::AllReduce(b.raw, s.buf.data(), n);
      if (name == "reduce_scatter")
        return comm::NcclRaw::ReduceScatter(b.raw, s.buf.data(), s.out.data(), per);
      return comm::NcclRaw::AllGather(b.raw, mine, s.out.data(), per);
    }
    if (name == "all_reduce") return comm::GlooRaw::AllReduce(b.raw, s.buf.data(), n);
    if (name == "reduce_scatter") return s.gloo_rs();
    return comm::GlooRaw::AllGather(b.raw, mine, s.out.data(), per);
  }, &secs));
  t.gloo.push_back(secs);
  return Status::Ok();
}

// The medians and bus bandwidths of one operation at one size: a table row on rank 0 (unless
// --json) and a JSON row.
void ReportOp(const Bench& b, const std::string& name, size_t n, const Timing& t,
              nlohmann::json& rows) {
  const BenchCommArgs& a = b.a;
  const std::string& base = b.base;
  const double zs = Median(t.zinf), gs = a.no_gloo ? NAN : Median(t.gloo);
  const double factor = (name == "all_reduce" ? 2.0 : 1.0) * double(b.w - 1) / double(b.w);
  const double bytes = double(n) * 4;
  const double zbus = bytes / zs * factor / 1e9, gbus = bytes / gs * factor / 1e9;
  if (b.lead && !a.json) {
    fmt::print("{:<15}{:>10}{:>10.2f}{:>10.2f}{:>15.2f}{:>15.2f}{:>11.3f}\n", name,
               FormatBytesHuman(uint64_t(bytes)), zs * 1e3, gs * 1e3, zbus, gbus, zs / gs);
    std::fflush(stdout);
  }
  rows.push_back({{"op", name}, {"bytes", uint64_t(bytes)}, {"zinf_seconds", zs},
                  {base + "_seconds", gs}, {"zinf_bus_gbps", zbus},
                  {base + "_bus_gbps", gbus}, {"zinf_over_" + base, zs / gs},
                  {"zinf_all", t.zinf}, {base + "_all", t.gloo}});
  if (a.vs_handoff) {
    const double hs = Median(t.handoff);
    rows.back()["handoff_seconds"] = hs;
    rows.back()["handoff_all"] = t.handoff;
    if (b.lead && !a.json)
      fmt::print("{:<15}{:>10}{:>10.2f}  (every operation on the communicator's thread: "
                 "zinf / this {:.3f})\n", "  handoff", "", hs * 1e3, zs / hs);
  }
}

// Every operation at one size, zinf's and the transport's alternating rep by rep.
Status BenchSize(const Bench& b, uint64_t size, nlohmann::json& rows) {
  const size_t w = size_t(b.w);
  SizeBuffers s;
  s.size = size;
  s.n = std::max<size_t>(w, size / 4 / w * w);  // divisible
  s.per = s.n / w;
  s.buf.resize(s.n);
  s.out.resize(s.n);
  if (!b.nccl) {
    ZINF_ASSIGN_OR_RETURN(s.gloo_rs,
                          comm::GlooRaw::PrepareReduceScatter(b.raw, s.buf.data(), s.per));
  }
  for (const char* op : {"all_reduce", "reduce_scatter", "all_gather"}) {
    const std::string name = op;
    Timing t;
    for (int rep = 0; rep < b.a.reps; ++rep) {
      ZINF_RETURN_IF_ERROR(TimeZinf(b, name, s, rep, t));
      if (b.a.no_gloo) continue;
      // The transport's own
      ZINF_RETURN_IF_ERROR(TimeBaseline(b, name, s, t));
    }
    ReportOp(b, name, s.n, t, rows);
  }
  return Status::Ok();
}

int Run(const BenchCommArgs& a) {
  auto sizes = ParseBytesList(a.sizes);
  if (!sizes.ok()) {
    fmt::print(stderr, "zinf bench-comm: --sizes: {}\n", sizes.status().message());
    return 2;
  }
  auto env = comm::ReadWorldEnv();
  if (!env.ok()) return Fail(env.status());
  if (env->world < 2) {
    fmt::print(stderr, "zinf bench-comm: needs 2 ranks or more; run it as `zinf launch --nproc 2 "
                       "-- zinf bench-comm`\n");
    return 2;
  }
  auto piece = ParseBytes(a.piece);
  if (!piece.ok() || *piece < 64) {
    fmt::print(stderr, "zinf bench-comm: --piece-bytes '{}': expected a size of 64 bytes or "
                       "more\n", a.piece);
    return 2;
  }
  comm::CommOptions opts;
  opts.timeout = std::chrono::seconds(120);
  opts.piece_bytes = *piece;
  opts.pipeline_depth = a.depth;
  auto transport = comm::ConnectGloo(*env, opts.timeout);
  if (!transport.ok()) return Fail(transport.status());
  const bool nccl = a.backend == "nccl";
  if (nccl) {
    const comm::RankGpu gpu = comm::GpuOfRank(*env, ProbeCuda().device_count);
    transport = comm::ConnectNccl(std::move(*transport), {}, gpu.ordinal, opts.timeout);
    if (!transport.ok()) return Fail(transport.status());
  }
  comm::Transport* raw = transport->get();
  auto c = comm::P2PCommunicator::Create(std::move(*transport), opts);
  auto* p2p = static_cast<comm::P2PCommunicator*>(c.get());
  const int w = c->world(), rank = c->rank();
  const Bench b{a, *c, *p2p, *raw, nccl, a.backend, w, rank, rank == 0};

  nlohmann::json rows = nlohmann::json::array();
  if (b.lead && !a.json) {
    fmt::print("bench-comm: {}, fp32, median of {} (the slowest rank each time)\n",
               c->Describe(), a.reps);
    fmt::print("{:<15}{:>10}{:>10}{:>10}{:>15}{:>15}{:>11}\n", "op", "size", "zinf ms",
               b.base + " ms", "zinf bus GB/s", b.base + " bus GB/s", "zinf/" + b.base);
  }
  for (uint64_t size : *sizes) {
    if (Status s = BenchSize(b, size, rows); !s.ok()) return Fail(s);
  }
  if (b.lead && a.json) {
    nlohmann::json j{{"transport", c->Describe()}, {"world", w}, {"reps", a.reps},
                     {"results", rows}};
    fmt::print("{}\n", j.dump(2));
  }
  return 0;
}

}  // namespace

void RegisterBenchComm(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchCommArgs>();
  auto* cmd = app.add_subcommand(
      "bench-comm",
      "Collectives' throughput, zinf's against the transport's own (Gloo's or NCCL's) on the same "
      "connections (run under `zinf launch --nproc N`)");
  cmd->add_option("--sizes", args->sizes, "comma-separated sizes (fp32 vector per rank)");
  cmd->add_option("--reps", args->reps, "timed repetitions of each (median)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--piece-bytes", args->piece,
                  "the reductions' piece per peer (CommOptions::piece_bytes)");
  cmd->add_option("--pipeline-depth", args->depth,
                  "the reductions' pieces in flight (CommOptions::pipeline_depth)")
      ->check(CLI::Range(2, 64));
  cmd->add_flag("--vs-handoff", args->vs_handoff,
                 "also time zinf with every operation on the communicator's thread, never the "
                 "waiter's (CommOptions::waiter_runs off), alternating");
  cmd->add_option("--backend", args->backend,
                  "the transport: gloo (TCP) or nccl (one GPU a rank, builds with NCCL)")
      ->check(CLI::IsMember({"gloo", "nccl"}));
  cmd->add_flag("--no-baseline,--no-gloo", args->no_gloo,
                "time zinf's collectives only, not the transport's own");
  cmd->add_flag("--json", args->json, "print JSON instead of a table");
  cmd->callback([args, &exit_code] { exit_code = Run(*args); });
}

}  // namespace zinf::tools
