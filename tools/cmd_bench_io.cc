// `zinf bench-io`: sequential and random reads and writes on a (striped) file, swept over
// block sizes and queue depths.
#include <filesystem>
#include <fstream>

#include <fmt/format.h>

#include "src/base/log.h"
#include "src/base/units.h"
#include "tools/commands.h"
#include "tools/io_bench.h"

namespace zinf::tools {
namespace {

struct BenchIoArgs {
  std::vector<std::string> paths;
  std::string engine = "auto";
  std::string ops = "read";
  std::string blocks = "1M";
  std::string qds = "8";
  std::string size = "1G";
  bool size_given = false;
  std::string time = "5";
  std::string stripe = "1M";
  unsigned threads = 0;
  bool json = false;
  bool keep = false;
  bool no_fill = false;
  std::string out;
};

// The target the paths name: a new test file in each directory, the kept one (--no-fill), or
// an existing file or block device, read only (see tools/io_bench_target.h).
Result<std::unique_ptr<IoBenchTarget>> OpenTarget(const BenchIoArgs& a, uint64_t size,
                                                  uint64_t stripe,
                                                  const std::vector<IoPattern>& ops) {
  std::vector<std::string> files;
  for (const auto& p : a.paths) {
    std::error_code ec;
    if (!std::filesystem::is_directory(p, ec)) files.push_back(p);
  }
  if (files.empty()) {
    if (a.no_fill) return IoBenchTarget::OpenKept(a.paths, size, stripe);
    return IoBenchTarget::Create(a.paths, size, stripe, a.keep);
  }
  if (a.paths.size() > 1) {
    return InvalidArgument(fmt::format(
        "--path {} is not a directory: an existing file or block device is measured alone (read "
        "only); striping over several --path needs directories", files[0]));
  }
  for (IoPattern op : ops) {
    if (!IsRead(op)) {
      return InvalidArgument(fmt::format(
          "--op {}: --path {} is an existing file or block device, which bench-io only reads "
          "and never modifies; name a directory to measure writes on a test file there",
          IoPatternName(op), files[0]));
    }
  }
  return IoBenchTarget::OpenReadOnly(files[0], a.size_given ? size : 0);
}

int RunBenchIo(const BenchIoArgs& a) {
  auto fail = [](const Status& s, int code) {
    fmt::print(stderr, "zinf bench-io: {}\n", s.ToString());
    return code;
  };
  std::vector<io::EngineKind> engines;
  for (const auto& name : SplitCommas(a.engine)) {
    auto k = io::ParseEngineKind(name);
    if (!k.ok()) return fail(k.status().WithContext("--engine"), 2);
    engines.push_back(*k);
  }
  std::vector<IoPattern> ops;
  for (const auto& name : SplitCommas(a.ops)) {
    auto p = ParseIoPattern(name);
    if (!p.ok()) return fail(p.status(), 2);
    ops.push_back(*p);
  }
  auto blocks = ParseBytesList(a.blocks);
  if (!blocks.ok()) return fail(blocks.status().WithContext("--block"), 2);
  auto qds = ParseUintList(a.qds);
  if (!qds.ok()) return fail(qds.status().WithContext("--qd"), 2);
  for (uint64_t q : *qds) {
    if (q == 0 || q > 1024) return fail(InvalidArgument(fmt::format("--qd {}: expected 1..1024", q)), 2);
  }
  auto size = ParseBytes(a.size);
  if (!size.ok()) return fail(size.status().WithContext("--size"), 2);
  auto seconds = ParseSeconds(a.time);
  if (!seconds.ok()) return fail(seconds.status().WithContext("--time"), 2);
  auto stripe = ParseBytes(a.stripe);
  if (!stripe.ok()) return fail(stripe.status().WithContext("--stripe"), 2);

  auto target = OpenTarget(a, *size, *stripe, ops);
  if (!target.ok()) {
    // A file or directory that cannot be used as given is bad usage; a failing disk is not.
    const StatusCode c = target.status().code();
    const bool usage = c == StatusCode::kFailedPrecondition || c == StatusCode::kInvalidArgument ||
                       c == StatusCode::kNotFound || c == StatusCode::kOutOfRange;
    return fail(target.status(), usage ? 2 : 1);
  }

  std::vector<IoBenchResult> results;
  const bool table = !a.json;
  if (table) {
    fmt::print("file: {} ({}{}, {}, {})\n", (*target)->path(),
               FormatBytesHuman((*target)->size()),
               a.paths.size() > 1 ? fmt::format(", striped over {} paths", a.paths.size()) : "",
               (*target)->KindName(), (*target)->direct() ? "O_DIRECT" : "buffered");
    fmt::print("{}\n", FormatTableHeader());
  }
  for (auto engine : engines) {
    for (auto op : ops) {
      for (uint64_t block : *blocks) {
        for (uint64_t qd : *qds) {
          IoBenchSpec spec;
          spec.engine = engine;
          spec.pattern = op;
          spec.block = block;
          spec.queue_depth = static_cast<unsigned>(qd);
          spec.posix_threads = a.threads;
          spec.seconds = *seconds;
          spec.bytes_limit = *seconds > 0 ? 0 : (*target)->size();
          auto r = RunIoBench(**target, spec);
          if (!r.ok()) return fail(r.status(), 1);
          if (a.json) fmt::print("{}\n", ToJson(*r).dump());
          else fmt::print("{}\n", FormatTableRow(*r));
          std::fflush(stdout);
          results.push_back(*r);
        }
      }
    }
  }
  if (!a.out.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(a.out, ec);
    if (ec) return fail(Status::FromErrno(ec.value(), "create --out directory " + a.out), 1);
    std::string csv = a.out + "/bench-io.csv";
    std::ofstream(csv) << FormatCsv(results);
    std::vector<std::string> written{csv};
    for (const auto& r0 : results) {
      std::string name = fmt::format("{}/bench-io-{}-{}.svg", a.out, r0.engine,
                                     IoPatternName(r0.pattern));
      if (std::find(written.begin(), written.end(), name) != written.end()) continue;
      std::vector<IoBenchResult> subset;
      for (const auto& r : results) {
        if (r.engine == r0.engine && r.pattern == r0.pattern) subset.push_back(r);
      }
      std::ofstream(name) << RenderSvgChart(
          subset, fmt::format("zinf bench-io: {} {} ({})", r0.engine, IoPatternName(r0.pattern),
                              (*target)->direct() ? "O_DIRECT" : "buffered"));
      written.push_back(name);
    }
    for (const auto& w : written) fmt::print(stderr, "wrote {}\n", w);
  }
  return 0;
}

}  // namespace

void RegisterBenchIo(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<BenchIoArgs>();
  auto* cmd = app.add_subcommand(
      "bench-io", "Measure NVMe throughput and latency: sequential/random reads and writes, "
                  "swept over block sizes and queue depths");
  cmd->add_option("--path", args->paths,
                  "Directory for the test file (repeat to stripe over several drives), or an "
                  "existing regular file or block device to read: never modified, write ops "
                  "refused; --size defaults to all of it")
      ->required()
      ->check(CLI::ExistingPath);
  cmd->add_option("--engine", args->engine, "uring, aio, posix or auto (a list sweeps)")
      ->capture_default_str();
  cmd->add_option("--op", args->ops, "read, write, randread, randwrite (a list sweeps)")
      ->capture_default_str();
  cmd->add_option("--block", args->blocks, "Request size, e.g. 1M or a list 128K,1M,8M")
      ->capture_default_str();
  cmd->add_option("--qd", args->qds, "Queue depth, e.g. 8 or a list 1,4,16,32")
      ->capture_default_str();
  auto* size_opt =
      cmd->add_option("--size", args->size, "Size of the test file")->capture_default_str();
  cmd->add_option("--time", args->time, "Seconds per run (0: one pass over --size)")
      ->capture_default_str();
  cmd->add_option("--stripe", args->stripe, "Stripe unit when several --path are given")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "posix engine worker threads (0: queue depth)");
  cmd->add_flag("--json", args->json, "One JSON object per run instead of a table");
  cmd->add_option("--out", args->out, "Also write bench-io.csv and SVG charts into this directory");
  cmd->add_flag("--keep", args->keep, "Keep the test file afterwards");
  cmd->add_flag("--no-fill", args->no_fill,
                "Use the test file an earlier --keep run left, as it is (not emptied, not "
                "written before reads, not removed); refused unless it is all written data on "
                "the disk (no hole, no unwritten extent)");
  cmd->callback([args, size_opt, &exit_code] {
    args->size_given = size_opt->count() > 0;
    exit_code = RunBenchIo(*args);
  });
}

}  // namespace zinf::tools
