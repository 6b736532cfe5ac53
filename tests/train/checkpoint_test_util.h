// tests/train/checkpoint_test_util.h — what the in-process checkpoint tests share: a small
// model's config, the options of a run of it, and reading back what a run wrote.
// Thread-safety: plain functions; each test uses its own temporary directory.
#pragma once

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/train/trainer.h"

namespace zinf::train::testing_ckpt {

// A 2-block, width-32 model with parameters and optimizer state on NVMe in `swap_dir`.
inline Config Offloaded(const std::string& swap_dir) {
  std::filesystem::create_directories(swap_dir);
  Config c;
  c.zinf.model = {.layers = 2, .width = 32, .heads = 4, .seq_len = 16, .vocab = 64};
  c.train.train_micro_batch_size_per_gpu = 4;
  c.train.gradient_clipping = 1.0;
  c.optimizer.lr = 3e-3;
  c.zinf.adam_threads = 2;
  c.zero.offload_param = {.device = OffloadDevice::kNvme, .nvme_path = swap_dir};
  c.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = swap_dir};
  c.zinf.budgets.device_bytes = 4 << 20;
  c.zinf.budgets.pinned_bytes = 16 << 20;
  return c;
}

// `steps` steps on the synthetic corpus, on the host device, writing <dir>/<tag>.losses and
// <dir>/<tag>.safetensors.
inline TrainOptions Options(const Config& c, const std::string& dir, const std::string& tag,
                            uint64_t steps) {
  TrainOptions o;
  o.config = c;
  o.steps = steps;
  o.synthetic_bytes = 64 << 10;
  o.losses_path = dir + "/" + tag + ".losses";
  o.save_path = dir + "/" + tag + ".safetensors";
  o.device = DeviceKind::kHost;
  return o;
}

inline std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The losses lines without their times and NVMe bytes.
inline std::vector<std::string> Losses(const std::vector<std::string>& paths) {
  std::vector<std::string> r;
  for (const auto& p : paths) {
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      j.erase("seconds");  // and what the step moved: a resumed or sharded run differs there
      j.erase("nvme_read_bytes");
      j.erase("nvme_write_bytes");
      r.push_back(j.dump());
    }
  }
  return r;
}

}  // namespace zinf::train::testing_ckpt
