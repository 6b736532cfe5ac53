// tools/io_bench.h — the I/O benchmark behind `zinf bench-io` and `zinf tune`.
//
// Contract: RunIoBench runs on an IoBenchTarget (tools/io_bench_target.h: a new test file,
// filled once before the first read run, a kept one, or an existing file or block device read
// only; write runs on a read-only target are refused). It keeps `queue_depth` requests of `block` bytes in flight
// for `seconds` (or until `bytes_limit` bytes moved), sequentially (wrapping at the end) or at
// uniformly random block-aligned offsets, and measures every request's latency from submission
// to completion. Every completion is checked: one failed request fails the run.
//
// Thread-safety: single-threaded use; one run at a time per target.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/engine.h"
#include "tools/io_bench_target.h"
#include "zinf/status.h"

namespace zinf::tools {

enum class IoPattern { kRead, kWrite, kRandRead, kRandWrite };  // fio's names: read, write...
std::string_view IoPatternName(IoPattern p);
Result<IoPattern> ParseIoPattern(std::string_view name);
inline bool IsRead(IoPattern p) { return p == IoPattern::kRead || p == IoPattern::kRandRead; }

struct IoBenchSpec {
  io::EngineKind engine = io::EngineKind::kAuto;
  IoPattern pattern = IoPattern::kRead;
  uint64_t block = 1 << 20;
  unsigned queue_depth = 8;
  unsigned posix_threads = 0;
  double seconds = 5.0;      // 0: run until bytes_limit
  uint64_t bytes_limit = 0;  // 0: no limit
  uint64_t seed = 1;
};

struct IoBenchResult {
  std::string engine;  // the engine that really ran
  IoPattern pattern = IoPattern::kRead;
  uint64_t block = 0;
  unsigned queue_depth = 0;
  uint64_t bytes = 0;
  uint64_t requests = 0;
  double seconds = 0;
  double gbps = 0;   // 10^9 bytes per second
  double gibps = 0;  // 2^30 bytes per second
  double iops = 0;
  double lat_p50_us = 0, lat_p99_us = 0, lat_max_us = 0;
  bool direct = true;
  bool registered_buffers = false;
};

nlohmann::json ToJson(const IoBenchResult& r);

Result<IoBenchResult> RunIoBench(IoBenchTarget& target, const IoBenchSpec& spec);

// Table rows, CSV and an SVG chart (GB/s against queue depth, one line per block size).
std::string FormatTableHeader();
std::string FormatTableRow(const IoBenchResult& r);
std::string FormatCsv(const std::vector<IoBenchResult>& results);
// One chart for the results of one engine and one pattern.
std::string RenderSvgChart(const std::vector<IoBenchResult>& results, const std::string& title);

}  // namespace zinf::tools
