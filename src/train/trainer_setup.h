// src/train/trainer_setup.h — Train()'s set-up (internal to src/train; trainer.h is the API):
// everything a run builds before its first step.
//
// Contract. SetUpRun(opt) validates the config against the world (zinf launch's environment),
// joins the ranks and checks that they agree, reads the checkpoint to resume (refusing one that
// does not fit the run), loads the data, builds the offload runtime, the backend and the layer
// executor, places the optimizer state (--placement, zinf.budgets.host_bytes, or the resumed
// checkpoint's), restores or initializes the weights and creates the checkpointer. Every refusal
// names the file, field or value at fault; nothing is left running when it fails. The TrainRun
// it returns owns all of it. Its members are declared so that they are destroyed in the order
// the loop needs: the checkpointer, then the executor, the backend and the runtime, then the
// tracer and the ranks (the executor holds pointers to the tracer and the communicator).
//
// Thread-safety: as Train (one at a time per process).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "src/base/trace.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/backend.h"
#include "src/train/checkpoint.h"
#include "src/train/data.h"
#include "src/train/executor.h"
#include "src/train/model.h"
#include "src/train/loss_scaler.h"
#include "src/train/lr_schedule.h"
#include "src/train/placement.h"
#include "src/train/ranks.h"
#include "src/train/trainer.h"

namespace zinf::train {

using TrainClock = std::chrono::steady_clock;

inline double SecondsSince(TrainClock::time_point t0) {
  return std::chrono::duration<double>(TrainClock::now() - t0).count();
}

struct TrainRun {
  Config shared;          // the run's config (its world size set), as checkpoints record it
  Config c;               // this rank's: `shared` with its own swap directories
  Ranks ranks;
  TrainerState resumed;   // the resumed checkpoint's; step 0 when not resuming
  Model model;
  uint32_t B = 0;         // micro-batch
  uint32_t T = 0;         // sequence length
  uint64_t gas = 1;       // gradient accumulation steps
  bool fp16 = false;
  std::optional<BatchSampler> train_data;
  std::optional<BatchSampler> val_data;  // only with --eval-every and a validation split
  std::optional<LrSchedule> schedule;
  std::optional<LossScaler> scaler;
  std::string trace_path;                // empty: no trace written
  std::unique_ptr<Tracer> tracer;
  ExecutorOptions eo;
  StatePlacement placement;
  std::unique_ptr<OffloadRuntime> rt;
  Stream* compute = nullptr;             // the device's, owned by rt
  std::unique_ptr<Backend<float>> backend;
  std::unique_ptr<LayerExecutor> ex;
  std::unique_ptr<Checkpointer> checkpointer;  // null without zinf.checkpoint.dir
};

Result<std::unique_ptr<TrainRun>> SetUpRun(const TrainOptions& opt);

}  // namespace zinf::train
