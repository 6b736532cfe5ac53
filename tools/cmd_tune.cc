// `zinf tune`: find the engine, block size and queue depth that get the most out of a disk,
// and print them as a DeepSpeed-style `aio` block.
//
// Coarse to fine, so the default finishes in about a minute instead of a full grid:
//  1. the first engine over the block x queue-depth grid, reads and writes (one run each);
//  2. the two best (block, qd) of each direction on the other engines;
//  3. the three best candidates of each direction again, alternated three times, ranked by
//     median (the disk's throughput drifts; alternation keeps the comparison fair).
#include <algorithm>
#include <chrono>
#include <map>
#include <tuple>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/units.h"
#include "src/base/host_info.h"
#include "tools/commands.h"
#include "tools/io_bench.h"

namespace zinf::tools {
namespace {

struct TuneArgs {
  std::vector<std::string> paths;
  std::string engines = "uring,aio,posix";
  std::string blocks = "256K,1M,4M";
  std::string qds = "4,8,16,32";
  std::string size = "1G";
  std::string time = "1";
  bool json = false;
};

using Key = std::tuple<std::string, uint64_t, unsigned>;  // engine, block, qd

// The command line, parsed.
struct TuneOptions {
  std::vector<io::EngineKind> engines;
  std::vector<uint64_t> blocks, qds;
  uint64_t size = 0;
  double seconds = 0;
};

Result<TuneOptions> ParseTuneOptions(const TuneArgs& a) {
  TuneOptions o;
  for (const auto& name : SplitCommas(a.engines)) {
    auto k = io::ParseEngineKind(name);
    if (!k.ok()) return k.status().WithContext("--engines");
    o.engines.push_back(*k);
  }
  auto blocks = ParseBytesList(a.blocks);
  if (!blocks.ok()) return blocks.status().WithContext("--blocks");
  o.blocks = *blocks;
  auto qds = ParseUintList(a.qds);
  if (!qds.ok()) return qds.status().WithContext("--qds");
  o.qds = *qds;
  auto size = ParseBytes(a.size);
  if (!size.ok()) return size.status().WithContext("--size");
  o.size = *size;
  auto seconds = ParseSeconds(a.time);
  if (!seconds.ok() || *seconds <= 0) {
    return InvalidArgument(fmt::format("--time '{}': expected seconds > 0", a.time));
  }
  o.seconds = *seconds;
  return o;
}

// The runs so far, each printed to `progress` as it ends.
struct Tuner {
  IoBenchTarget& target;
  double seconds;
  FILE* progress;
  std::map<Key, std::vector<double>> samples[2];  // [0] read, [1] write
  std::map<Key, IoBenchResult> last[2];

  Status Run(io::EngineKind engine, IoPattern op, uint64_t block, unsigned qd) {
    IoBenchSpec spec{.engine = engine, .pattern = op, .block = block, .queue_depth = qd,
                     .seconds = seconds};
    auto r = RunIoBench(target, spec);
    if (!r.ok()) return r.status();
    fmt::print(progress, "{}\n", FormatTableRow(*r));
    std::fflush(progress);
    int d = IsRead(op) ? 0 : 1;
    Key k{r->engine, block, qd};
    samples[d][k].push_back(r->gbps);
    last[d][k] = *r;
    return Status::Ok();
  }

  // Direction d's settings, the fastest (median GB/s) first.
  std::vector<std::pair<double, Key>> Ranked(int d) const {
    std::vector<std::pair<double, Key>> v;
    for (auto& [k, s] : samples[d]) v.push_back({Median(s), k});
    std::sort(v.begin(), v.end(), [](auto& x, auto& y) { return x.first > y.first; });
    return v;
  }
};

constexpr IoPattern kOps[2] = {IoPattern::kRead, IoPattern::kWrite};

// Runs the three phases of the search.
Status Search(const TuneOptions& o, Tuner& t) {
  // 1. Grid on the first engine.
  for (int d = 0; d < 2; ++d) {
    for (uint64_t b : o.blocks) {
      for (uint64_t q : o.qds) {
        ZINF_RETURN_IF_ERROR(t.Run(o.engines[0], kOps[d], b, static_cast<unsigned>(q)));
      }
    }
  }
  // 2. The two best shapes of each direction on the other engines.
  for (size_t e = 1; e < o.engines.size(); ++e) {
    for (int d = 0; d < 2; ++d) {
      auto top = t.Ranked(d);
      std::vector<std::pair<uint64_t, unsigned>> shapes;
      for (auto& [g, k] : top) {
        auto shape = std::make_pair(std::get<1>(k), std::get<2>(k));
        if (std::find(shapes.begin(), shapes.end(), shape) == shapes.end()) shapes.push_back(shape);
        if (shapes.size() == 2) break;
      }
      for (auto [b, q] : shapes) ZINF_RETURN_IF_ERROR(t.Run(o.engines[e], kOps[d], b, q));
    }
  }
  // 3. Alternate the three best of each direction, three rounds.
  std::vector<Key> finalists[2];
  for (int d = 0; d < 2; ++d) {
    auto top = t.Ranked(d);
    for (size_t i = 0; i < top.size() && i < 3; ++i) finalists[d].push_back(top[i].second);
  }
  for (int round = 0; round < 3; ++round) {
    for (int d = 0; d < 2; ++d) {
      for (const Key& k : finalists[d]) {
        auto kind = io::ParseEngineKind(std::get<0>(k));
        ZINF_RETURN_IF_ERROR(t.Run(*kind, kOps[d], std::get<1>(k), std::get<2>(k)));
      }
    }
  }
  return Status::Ok();
}

// Prints the best of each direction (unless --json) and the config block of the setting
// chosen; the time is counted from t0.
void PrintTuned(const TuneArgs& a, Tuner& t, std::chrono::steady_clock::time_point t0) {
  auto& samples = t.samples;
  auto best_read = t.Ranked(0).front();
  auto best_write = t.Ranked(1).front();
  // One setting for both directions: the best worst-case fraction of each direction's best.
  Key chosen = best_read.second;
  double chosen_score = -1;
  for (auto& [k, rs] : samples[0]) {
    auto w = samples[1].find(k);
    if (w == samples[1].end()) continue;
    double score = std::min(Median(rs) / best_read.first, Median(w->second) / best_write.first);
    if (score > chosen_score) { chosen_score = score; chosen = k; }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto describe = [&](const std::pair<double, Key>& b) {
    return nlohmann::json{{"gbps", b.first}, {"engine", std::get<0>(b.second)},
                          {"block_size", std::get<1>(b.second)},
                          {"queue_depth", std::get<2>(b.second)}};
  };
  const std::string& ce = std::get<0>(chosen);
  nlohmann::json out = {
      {"aio",
       {{"block_size", std::get<1>(chosen)},
        {"queue_depth", std::get<2>(chosen)},
        // posix runs one blocking thread per request in flight; the kernel engines need one.
        {"intra_op_parallelism", ce == "posix" ? std::get<2>(chosen) : 1},
        {"single_submit", false},
        {"overlap_events", true},
        {"engine", ce}}},
      {"read_gbps", Median(samples[0][chosen])},
      {"write_gbps", Median(samples[1][chosen])},
      {"best_read", describe(best_read)},
      {"best_write", describe(best_write)},
      {"runs", [&] { size_t n = 0; for (auto& m : samples) for (auto& [k, v] : m) n += v.size(); return n; }()},
      {"seconds", elapsed}};
  if (!a.json) {
    fmt::print("\nbest read : {:.3f} GB/s ({} block {} qd {})\n", best_read.first,
               std::get<0>(best_read.second), FormatBytesShort(std::get<1>(best_read.second)),
               std::get<2>(best_read.second));
    fmt::print("best write: {:.3f} GB/s ({} block {} qd {})\n", best_write.first,
               std::get<0>(best_write.second), FormatBytesShort(std::get<1>(best_write.second)),
               std::get<2>(best_write.second));
    fmt::print("tuned in {:.0f} s; put this in the config:\n", elapsed);
  }
  fmt::print("{}\n", out.dump(2));
}

int RunTune(const TuneArgs& a) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf tune: {}\n", s.ToString());
    return code;
  };
  auto opts = ParseTuneOptions(a);
  if (!opts.ok()) return fail(opts.status(), 2);
  const auto t0 = std::chrono::steady_clock::now();
  auto target = IoBenchTarget::Create(a.paths, opts->size, 1 << 20, false);
  if (!target.ok()) return fail(target.status(), 1);

  FILE* progress = a.json ? stderr : stdout;
  fmt::print(progress, "{}\n", FormatTableHeader());
  Tuner t{**target, opts->seconds, progress, {}, {}};
  if (Status s = Search(*opts, t); !s.ok()) return fail(s, 1);
  PrintTuned(a, t, t0);
  return 0;
}

}  // namespace

void RegisterTune(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TuneArgs>();
  auto* cmd = app.add_subcommand(
      "tune", "Sweep engine x block size x queue depth on a directory and print the best "
              "settings as a DeepSpeed-style `aio` block");
  cmd->add_option("--path", args->paths, "Directory to tune; repeat to stripe")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--engines", args->engines, "Engines to compare, the first gets the full grid")
      ->capture_default_str();
  cmd->add_option("--blocks", args->blocks, "Block sizes of the grid")->capture_default_str();
  cmd->add_option("--qds", args->qds, "Queue depths of the grid")->capture_default_str();
  cmd->add_option("--size", args->size, "Size of the test file")->capture_default_str();
  cmd->add_option("--time", args->time, "Seconds per run")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print only the JSON result on stdout (progress on stderr)");
  cmd->callback([args, &exit_code] { exit_code = RunTune(*args); });
}

}  // namespace zinf::tools
