// tools/train_config.h — the config of one `zinf train` run, and where each value came from.
//
// Contract: BuildTrainConfig starts from the default job's config (src/train/default_job.h),
// reads the --config file onto it (a key the file gives replaces the default; see
// src/config/config.h for the groups replaced whole), then applies the flags the command line
// gave (`cmd.count(flag)`), each replacing the value it names. With --init FILE, the model
// sizes FILE records in its metadata (src/train/weights_io.h) replace the defaults; a size the
// config file or a flag gave that disagrees with FILE's is refused, naming both values and
// where each came from (a file recording no sizes leaves them to the config and flags, and
// LoadWeights refuses mismatched shapes). With NVMe in use and no swap
// directory anywhere it picks build/train-swap next to the executable, and fills each empty
// nvme_path with the swap directory. It then Validate()s and returns the config with a
// ConfigSources naming, for each value, `default`, the file's path or the flag. It creates
// nothing: PrepareSwapDirs creates the swap directories before a run.
// Errors: the file's problems as Config::FromFile reports them, a byte-size flag that does not
// parse (naming the flag), the cross-field rules of Config::Validate.
//
// Thread-safety: single-threaded (called from the command's callback).
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <optional>
#include <string>

#include "src/config/config.h"
#include "src/config/config_sources.h"
#include "src/train/checkpoint.h"
#include "zinf/status.h"

namespace zinf::tools {

// The options of `zinf train`, as CLI11 fills them.
struct TrainArgs {
  std::string config, data, val_data, data_format = "auto", init, save, losses, summary, trace;
  std::string swap_dir, device = "auto";
  std::string device_budget, pinned_budget, host_budget, placement = "auto", offload, precision, schedule, state_dtype, state_rounding;
  std::string checkpoint_dir, resume;
  bool strict = false, profile = false, overlap_adam = false, print_config = false;
  bool verify_state_reads = false;
  uint64_t steps = 150, eval_every = 0, synthetic_bytes = 4 << 20, checkpoint_every = 0;
  uint64_t stop_after = 0;
  bool compare_checkpoint_copy = false;
  uint32_t keep_checkpoints = 1;
  uint32_t comm_timeout = 0;
  std::string arch, preset;
  uint32_t layers = 0, width = 0, heads = 0, seq_len = 0, vocab = 0, batch = 0, accum = 0;
  uint32_t kv_heads = 0, intermediate = 0;
  double lr = 0, clip = -1, h2d_gbps = 0;
  uint64_t seed = 0;
};

struct TrainRunConfig {
  Config config;
  ConfigSources sources;
  // A resume: the total steps its checkpoint's run was asked for, its data and evaluation
  // options (the defaults of --steps, --data, --val-data, --data-format, --synthetic-bytes,
  // --eval-every then).
  std::optional<train::RecordedRun> resumed_run;
};

Result<TrainRunConfig> BuildTrainConfig(const CLI::App& cmd, const TrainArgs& args);

// Adds `zinf train`'s flags to `cmd` (zinf plan takes the same ones), filling `a`.
void AddTrainFlags(CLI::App* cmd, TrainArgs* a);

// Creates the swap directories the config names (NVMe offload only).
Status PrepareSwapDirs(const Config& config);

}  // namespace zinf::tools
