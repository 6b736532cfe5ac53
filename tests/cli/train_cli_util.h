// tests/cli/train_cli_util.h — what the `zinf train` end-to-end tests share: the tiny model's
// flags and what its runs write (progress lines, JSON, JSON lines, safetensors headers).
#pragma once

#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/test_util.h"

namespace zinf::testing::train_cli {

// The tiny model's parameters: 28,032.
inline constexpr uint64_t kParams = 2 * (12 * 32 * 32 + 13 * 32) + (64 + 16) * 32 + 2 * 32;
inline constexpr uint64_t kDeviceBudget = 4ull << 20, kPinnedBudget = 16ull << 20;

// The tiny model and its budgets; the placement and step count are the caller's.
inline std::string Tiny(uint64_t steps) {
  return "train --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 64 --batch 4 --steps " +
         std::to_string(steps) + " --device-budget 4M --pinned-budget 16M --synthetic-bytes 65536";
}
// The default job's training keys, for a test's config file that is about something else
// (placement, stages) and is compared with runs without a file: a file that leaves them out
// trains at DeepSpeed's constant lr without clipping (tools/train_config.cc).
inline constexpr char kDefaultJobTraining[] =
    R"("gradient_clipping": 1.0, "scheduler": {"type": "WarmupCosineLR", "params": )"
    R"({"warmup_num_steps": 10, "warmup_type": "linear", "warmup_min_ratio": 0.0, )"
    R"("cos_min_ratio": 0.1}})";
// ... paged through NVMe, with its swap under `dir`.
inline std::string TinyNvme(uint64_t steps, const TempDir& dir) {
  return Tiny(steps) + " --offload nvme --swap-dir " + dir / "swap";
}

inline std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// The progress lines of a run's stdout ("step    1/3 | loss ... | ETA 0s").
inline std::vector<std::string> ProgressLines(const std::string& out) {
  std::vector<std::string> r;
  for (const std::string& l : Lines(out)) {
    if (l.rfind("step ", 0) == 0) r.push_back(l);
  }
  return r;
}

inline nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  return nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
}

inline std::vector<nlohmann::json> ReadJsonLines(const std::string& path) {
  std::vector<nlohmann::json> r;
  for (const std::string& l : Lines(ReadFile(path))) {
    r.push_back(nlohmann::json::parse(l, nullptr, false));
    EXPECT_FALSE(r.back().is_discarded()) << path << ": " << l;
  }
  return r;
}

// What must agree between two runs, step by step: everything a losses line holds but its time,
// over the losses files in order.
inline std::vector<std::string> LossRecords(const std::vector<std::string>& paths) {
  std::vector<std::string> r;
  for (const std::string& p : paths) {
    for (nlohmann::json j : ReadJsonLines(p)) {
      // What the step took and moved depends on the run (a resumed one starts cold).
      j.erase("seconds");
      j.erase("nvme_read_bytes");
      j.erase("nvme_write_bytes");
      r.push_back(j.dump());
    }
  }
  return r;
}

// The JSON header of a safetensors file (8-byte little-endian length, then the JSON).
inline nlohmann::json SafetensorsHeader(const std::string& path) {
  const std::string bytes = ReadFile(path);
  if (bytes.size() < 8) return nlohmann::json::value_t::discarded;
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  if (n > bytes.size() - 8) return nlohmann::json::value_t::discarded;
  return nlohmann::json::parse(bytes.substr(8, n), nullptr, false);
}

}  // namespace zinf::testing::train_cli
