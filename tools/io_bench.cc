#include "tools/io_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include <fmt/format.h>

#include "io/aligned_buffer.h"
#include "src/base/units.h"

namespace zinf::tools {

using Clock = std::chrono::steady_clock;

std::string_view IoPatternName(IoPattern p) {
  switch (p) {
    case IoPattern::kRead: return "read";
    case IoPattern::kWrite: return "write";
    case IoPattern::kRandRead: return "randread";
    case IoPattern::kRandWrite: return "randwrite";
  }
  return "?";
}

Result<IoPattern> ParseIoPattern(std::string_view name) {
  if (name == "read" || name == "seqread") return IoPattern::kRead;
  if (name == "write" || name == "seqwrite") return IoPattern::kWrite;
  if (name == "randread") return IoPattern::kRandRead;
  if (name == "randwrite") return IoPattern::kRandWrite;
  return InvalidArgument(fmt::format(
      "unknown --op '{}': expected read, write, randread or randwrite (fio's names)", name));
}

nlohmann::json ToJson(const IoBenchResult& r) {
  return {{"engine", r.engine},         {"op", IoPatternName(r.pattern)},
          {"block_bytes", r.block},     {"queue_depth", r.queue_depth},
          {"bytes", r.bytes},           {"requests", r.requests},
          {"seconds", r.seconds},       {"gbps", r.gbps},
          {"gibps", r.gibps},           {"iops", r.iops},
          {"lat_p50_us", r.lat_p50_us}, {"lat_p99_us", r.lat_p99_us},
          {"lat_max_us", r.lat_max_us}, {"direct", r.direct},
          {"registered_buffers", r.registered_buffers}};
}

namespace {

// Refuses a spec the target cannot run; fills the target before the first read run.
Status CheckSpec(IoBenchTarget& target, const IoBenchSpec& spec) {
  const uint64_t align = target.offset_align();
  if (spec.block == 0 || spec.block % align != 0) {
    return InvalidArgument(fmt::format("--block {} must be a positive multiple of {} (the "
                                       "O_DIRECT alignment of {})",
                                       spec.block, align, target.path()));
  }
  if (!IsRead(spec.pattern) && target.read_only()) {
    return FailedPrecondition(fmt::format(
        "--op {}: {} ({}) is only read, never modified; name a directory as --path to measure "
        "writes on a test file there", IoPatternName(spec.pattern), target.path(),
        target.KindName()));
  }
  if (spec.block > target.size()) {
    return InvalidArgument(fmt::format("--block {} is larger than --size {}", spec.block,
                                       target.size()));
  }
  if (spec.seconds <= 0 && spec.bytes_limit == 0) {
    return InvalidArgument("a run needs a time or a byte limit");
  }
  if (IsRead(spec.pattern)) ZINF_RETURN_IF_ERROR(target.EnsureFilled());
  return Status::Ok();
}

// What one run measured, and of its engine.
struct Measured {
  std::string engine;
  bool registered_buffers = false;
  uint64_t done_bytes = 0;
  std::vector<float> lat_us;  // each request's latency
  double seconds = 0;
};

// Keeps `queue_depth` requests in flight until the time or byte limit.
Result<Measured> Measure(IoBenchTarget& target, const IoBenchSpec& spec) {
  io::EngineOptions eo;
  eo.kind = spec.engine;
  eo.block_size = spec.block;
  eo.queue_depth = spec.queue_depth;
  eo.posix_threads = spec.posix_threads;
  ZINF_ASSIGN_OR_RETURN(auto engine, io::Engine::Create(eo));
  ZINF_ASSIGN_OR_RETURN(io::FileId file, engine->AddFile(target.Layout()));
  ZINF_ASSIGN_OR_RETURN(io::AlignedBuffer buffers,
                        io::AlignedBuffer::Allocate(spec.block * spec.queue_depth,
                                                    std::max<uint32_t>(target.mem_align(),
                                                                       4096)));
  ZINF_RETURN_IF_ERROR(engine->RegisterBuffer(buffers.data(), buffers.size()));
  std::mt19937_64 rng(spec.seed);
  for (size_t i = 0; i < buffers.size(); i += 8) {
    uint64_t v = rng();
    std::memcpy(buffers.data() + i, &v, std::min<size_t>(8, buffers.size() - i));
  }

  const io::OpKind op = IsRead(spec.pattern) ? io::OpKind::kRead : io::OpKind::kWrite;
  const bool random = spec.pattern == IoPattern::kRandRead || spec.pattern == IoPattern::kRandWrite;
  const uint64_t blocks_in_file = target.size() / spec.block;
  uint64_t next_seq = 0;
  uint64_t bytes_issued = 0;
  std::vector<Clock::time_point> started(spec.queue_depth);
  std::vector<float> lat_us;
  lat_us.reserve(1 << 16);
  Status first_error;
  unsigned inflight = 0;
  uint64_t done_bytes = 0;
  const auto t0 = Clock::now();
  const auto deadline = spec.seconds > 0
                            ? t0 + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(spec.seconds))
                            : Clock::time_point::max();

  std::function<void(unsigned)> issue;
  auto more = [&] {
    if (!first_error.ok()) return false;
    if (spec.bytes_limit != 0 && bytes_issued >= spec.bytes_limit) return false;
    return Clock::now() < deadline;
  };
  issue = [&](unsigned slot) {
    uint64_t block_index;
    if (random) {
      block_index = rng() % blocks_in_file;
    } else {
      block_index = next_seq;
      next_seq = (next_seq + 1) % blocks_in_file;
    }
    io::Request req{op, file, block_index * spec.block, buffers.data() + slot * spec.block,
                    spec.block};
    started[slot] = Clock::now();
    bytes_issued += spec.block;
    inflight++;
    Status s = engine->Submit(req, [&, slot](const Status& st) {
      inflight--;
      auto now = Clock::now();
      lat_us.push_back(std::chrono::duration<float, std::micro>(now - started[slot]).count());
      if (!st.ok()) {
        if (first_error.ok()) first_error = st;
        return;
      }
      done_bytes += spec.block;
      if (more()) issue(slot);
    });
    if (!s.ok()) {
      inflight--;
      if (first_error.ok()) first_error = s;
    }
  };
  for (unsigned slot = 0; slot < spec.queue_depth && more(); ++slot) issue(slot);
  while (inflight > 0) {
    auto r = engine->Poll(true);
    if (!r.ok()) return r.status();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!first_error.ok()) return first_error;
  return Measured{std::string(engine->name()), engine->buffers_registered(), done_bytes,
                  std::move(lat_us), seconds};
}

}  // namespace

Result<IoBenchResult> RunIoBench(IoBenchTarget& target, const IoBenchSpec& spec) {
  ZINF_RETURN_IF_ERROR(CheckSpec(target, spec));
  ZINF_ASSIGN_OR_RETURN(Measured m, Measure(target, spec));
  std::vector<float>& lat_us = m.lat_us;
  const uint64_t done_bytes = m.done_bytes;
  const double seconds = m.seconds;

  IoBenchResult res;
  res.engine = m.engine;
  res.pattern = spec.pattern;
  res.block = spec.block;
  res.queue_depth = spec.queue_depth;
  res.bytes = done_bytes;
  res.requests = lat_us.size();
  res.seconds = seconds;
  res.gbps = static_cast<double>(done_bytes) / seconds / 1e9;
  res.gibps = static_cast<double>(done_bytes) / seconds / static_cast<double>(1ull << 30);
  res.iops = static_cast<double>(res.requests) / seconds;
  res.direct = target.direct();
  res.registered_buffers = m.registered_buffers;
  if (!lat_us.empty()) {
    auto pct = [&](double q) {
      size_t k = std::min(lat_us.size() - 1, static_cast<size_t>(q * (lat_us.size() - 1) + 0.5));
      std::nth_element(lat_us.begin(), lat_us.begin() + static_cast<long>(k), lat_us.end());
      return static_cast<double>(lat_us[k]);
    };
    res.lat_p50_us = pct(0.50);
    res.lat_p99_us = pct(0.99);
    res.lat_max_us = *std::max_element(lat_us.begin(), lat_us.end());
  }
  return res;
}

std::string FormatTableHeader() {
  return fmt::format("{:<6} {:<9} {:>6} {:>4} {:>8} {:>8} {:>9} {:>9} {:>9}", "engine", "op",
                     "block", "qd", "GB/s", "GiB/s", "IOPS", "p50(us)", "p99(us)");
}

std::string FormatTableRow(const IoBenchResult& r) {
  return fmt::format("{:<6} {:<9} {:>6} {:>4} {:>8.3f} {:>8.3f} {:>9.0f} {:>9.1f} {:>9.1f}",
                     r.engine, IoPatternName(r.pattern), FormatBytesShort(r.block), r.queue_depth,
                     r.gbps, r.gibps, r.iops, r.lat_p50_us, r.lat_p99_us);
}

std::string FormatCsv(const std::vector<IoBenchResult>& results) {
  std::string out =
      "engine,op,block_bytes,queue_depth,bytes,seconds,gbps,gibps,iops,lat_p50_us,lat_p99_us\n";
  for (const auto& r : results) {
    out += fmt::format("{},{},{},{},{},{:.6f},{:.6f},{:.6f},{:.1f},{:.2f},{:.2f}\n", r.engine,
                       IoPatternName(r.pattern), r.block, r.queue_depth, r.bytes, r.seconds,
                       r.gbps, r.gibps, r.iops, r.lat_p50_us, r.lat_p99_us);
  }
  return out;
}

std::string RenderSvgChart(const std::vector<IoBenchResult>& results, const std::string& title) {
  constexpr double kW = 720, kH = 440, kLeft = 70, kRight = 150, kTop = 50, kBottom = 60;
  const double pw = kW - kLeft - kRight, ph = kH - kTop - kBottom;
  std::vector<unsigned> qds;
  std::vector<uint64_t> blocks;
  double ymax = 0;
  for (const auto& r : results) {
    if (std::find(qds.begin(), qds.end(), r.queue_depth) == qds.end()) qds.push_back(r.queue_depth);
    if (std::find(blocks.begin(), blocks.end(), r.block) == blocks.end()) blocks.push_back(r.block);
    ymax = std::max(ymax, r.gbps);
  }
  std::sort(qds.begin(), qds.end());
  std::sort(blocks.begin(), blocks.end());
  // A round top for the y axis.
  double step = 0.1;
  for (double s : {0.1, 0.2, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 10.0, 20.0, 50.0}) {
    step = s;
    if (ymax / s <= 8) break;
  }
  double ytop = std::max(step, std::ceil(ymax / step) * step);
  auto x_of = [&](unsigned qd) {
    size_t i = std::find(qds.begin(), qds.end(), qd) - qds.begin();
    return kLeft + (qds.size() == 1 ? pw / 2 : pw * static_cast<double>(i) / (qds.size() - 1));
  };
  auto y_of = [&](double v) { return kTop + ph - ph * v / ytop; };
  static constexpr const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                            "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" "
      "font-family=\"sans-serif\" font-size=\"12\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"28\" font-size=\"16\" text-anchor=\"middle\">{}</text>\n",
      kW, kH, kLeft + pw / 2, title);
  for (double v = 0; v <= ytop + 1e-9; v += step) {
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2:.1f}\" y2=\"{2:.1f}\" stroke=\"#ddd\"/>"
                     "<text x=\"{3}\" y=\"{4:.1f}\" text-anchor=\"end\">{5:g}</text>\n",
                     kLeft, kLeft + pw, y_of(v), kLeft - 8, y_of(v) + 4, v);
  }
  for (unsigned qd : qds) {
    s += fmt::format("<text x=\"{:.1f}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n", x_of(qd),
                     kTop + ph + 18, qd);
  }
  s += fmt::format("<line x1=\"{0}\" x2=\"{0}\" y1=\"{1}\" y2=\"{2}\" stroke=\"black\"/>"
                   "<line x1=\"{0}\" x2=\"{3}\" y1=\"{2}\" y2=\"{2}\" stroke=\"black\"/>\n",
                   kLeft, kTop, kTop + ph, kLeft + pw);
  s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">queue depth</text>\n",
                   kLeft + pw / 2, kH - 18);
  s += fmt::format("<text transform=\"translate(20,{}) rotate(-90)\" text-anchor=\"middle\">"
                   "GB/s (10^9 bytes/s)</text>\n", kTop + ph / 2);
  for (size_t b = 0; b < blocks.size(); ++b) {
    const char* color = kColors[b % 8];
    std::vector<const IoBenchResult*> pts;
    for (const auto& r : results) if (r.block == blocks[b]) pts.push_back(&r);
    std::sort(pts.begin(), pts.end(),
              [](auto* a, auto* c) { return a->queue_depth < c->queue_depth; });
    std::string poly;
    for (auto* p : pts) poly += fmt::format("{:.1f},{:.1f} ", x_of(p->queue_depth), y_of(p->gbps));
    s += fmt::format("<polyline fill=\"none\" stroke=\"{}\" stroke-width=\"2\" points=\"{}\"/>\n",
                     color, poly);
    for (auto* p : pts) {
      s += fmt::format("<circle cx=\"{:.1f}\" cy=\"{:.1f}\" r=\"3.5\" fill=\"{}\"><title>{} qd {}: "
                       "{:.3f} GB/s</title></circle>\n",
                       x_of(p->queue_depth), y_of(p->gbps), color,
                       FormatBytesShort(p->block), p->queue_depth, p->gbps);
    }
    double ly = kTop + 10 + 20.0 * static_cast<double>(b);
    s += fmt::format("<line x1=\"{0}\" x2=\"{1}\" y1=\"{2}\" y2=\"{2}\" stroke=\"{3}\" "
                     "stroke-width=\"2\"/><text x=\"{4}\" y=\"{5}\">block {6}</text>\n",
                     kLeft + pw + 15, kLeft + pw + 40, ly, color, kLeft + pw + 46, ly + 4,
                     FormatBytesShort(blocks[b]));
  }
  s += "</svg>\n";
  return s;
}

}  // namespace zinf::tools
