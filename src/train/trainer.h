// src/train/trainer.h — `zinf train`: the training loop over the layer executor.
//
// Contract. Train() builds the offload runtime from the config (device, pinned pool, swap
// space on NVMe when offload_param/offload_optimizer say "nvme", tier manager), the backend for
// that device (CPU ops on the host-emulated device, CUDA ops on a GPU), the layer executor and the
// data (src/train/data.h: a text, nanoGPT or llm.c token file, or the built-in synthetic corpus;
// validation from its tail or a separate file), then runs each step as
// llm.c reads: next batch, forward + backward (per micro-batch, gradients accumulated in the
// offload core), clip, optimizer step. With the DeepSpeed keys kept:
//   train_micro_batch_size_per_gpu, gradient_accumulation_steps (the loss is averaged over
//   them), gradient_clipping (global L2 norm, coefficient min(1, clip / (norm + 1e-6)) as
//   torch.nn.utils.clip_grad_norm_), optimizer Adam/AdamW (lr, betas, eps, weight_decay,
//   adam_w_mode), scheduler (WarmupLR, WarmupDecayLR, WarmupCosineLR), bf16 (default) or fp16
//   with DeepSpeed's dynamic loss scaling: a step whose gradients hold an inf or a NaN is
//   skipped (state untouched) and counted; in bf16 such a step is skipped and counted too.
// zinf.overlap_adam runs each unit's Adam during the last micro-batch's backward (executor.h),
// clipping with the previous step's coefficient.
// One progress line per step goes to `progress` (step, loss, lr, tokens/s, stall %, NVMe GB/s,
// ETA). A stop request (SIGINT/SIGTERM, or TrainOptions::stop_after) ends the run after the
// current step, committing a checkpoint when zinf.checkpoint.dir is set; weights are still
// saved. Checkpoints and resume: src/train/checkpoint.h (zinf.checkpoint).
// Errors name the file, field or value at fault.
//
// Thread-safety: one Train at a time per process (it owns the device it builds).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "io/backend.h"
#include "src/base/device.h"
#include "src/config/config.h"
#include "src/train/token_file.h"
#include "zinf/status.h"

namespace zinf::train {

struct TrainOptions {
  Config config;                   // validated by Train
  uint64_t steps = 50;             // optimizer steps
  std::string data_path;           // empty: the synthetic corpus
  std::string val_data_path;       // empty: the training data's tail validates (val_fraction)
  DataFormat data_format = DataFormat::kAuto;  // of both files (src/train/token_file.h)
  uint64_t synthetic_bytes = 4 << 20;
  double val_fraction = 0.1;
  uint64_t eval_every = 0;         // validation loss every N steps (and at the end); 0 = never
  uint32_t eval_batches = 4;
  std::string init_path;           // safetensors weights to start from
  std::string save_path;           // safetensors of the final fp32 weights
  std::string losses_path;         // JSON lines: {"step", "loss", "lr", ...}
  std::string summary_path;        // one JSON object (TrainSummary)
  std::string trace_path;          // Chrome trace (empty: the config's zinf.trace_file)
  DeviceKind device = DeviceKind::kAuto;
  // Where each unit's optimizer state lives: "auto", "nvme" or a placement file
  // (src/train/placement.h).
  std::string placement = "auto";
  double h2d_gbps = 0;             // host-emulated device link (0 = memcpy speed)
  bool profile = false;  // measure the bounds (compute, NVMe, Adam, collectives) alone
  const std::atomic<bool>* stop = nullptr;
  uint64_t stop_after = 0;         // stop after this step as a stop request does (0: no)
  // After each checkpoint's commit, time a plain copy of its bytes (Checkpointer::
  // MeasurePlainCopy) between steps: the benchmark's yardstick.
  bool compare_checkpoint_copy = false;
  std::function<void(const std::string&)> progress;  // one line per step
  // Tests: wraps the NVMe I/O backend (RuntimeOptions::wrap_backend), e.g. to inject faults.
  std::function<std::unique_ptr<io::Backend>(std::unique_ptr<io::Backend>)> wrap_backend;
};

struct TrainSummary {
  uint64_t steps = 0, skipped_steps = 0, params = 0, tokens_per_step = 0;
  double first_loss = 0, final_loss = 0, val_loss = -1;
  double tokens_per_s = 0, step_seconds_median = 0, stall_fraction = 0;
  uint64_t nvme_read_bytes = 0, nvme_write_bytes = 0;
  // The median step's NVMe bytes, and what zinf plan's arithmetic predicts of them (one rank
  // with NVMe; 0 otherwise).
  double nvme_read_bytes_step_median = 0, nvme_write_bytes_step_median = 0;
  double plan_nvme_read_bytes_per_step = 0, plan_nvme_write_bytes_per_step = 0;
  // Tier manager: acquires that found their copy in place / had to fetch it; the optimizer's
  // new 16-bit weights put straight into the host tier (not read back from NVMe).
  uint64_t prefetch_hits = 0, prefetch_misses = 0, param16_installs = 0;
  // 16-bit weights cast from master weights in memory (their loads: no NVMe read).
  uint64_t param16_derived_load_bytes = 0;
  // Device link traffic (weights up; gradients and write-backs down) and evictions per tier:
  // device_evictions > 0 shows the device tier paging within a step.
  uint64_t h2d_bytes = 0, d2h_bytes = 0, device_evictions = 0, host_evictions = 0;
  // The median step's link bytes each way, and what zinf plan's arithmetic predicts of them.
  double h2d_bytes_step_median = 0, d2h_bytes_step_median = 0;
  double plan_h2d_bytes_per_step = 0, plan_d2h_bytes_per_step = 0;
  // The process's peak resident set: the pinned budget (locked, all resident), the device
  // memory touched on the host-emulated device (none on a GPU), the optimizer state in host
  // memory with --offload cpu, and a fixed overhead (code, libraries, the corpus, thread stacks).
  uint64_t peak_rss_bytes = 0;
  uint64_t peak_device_bytes = 0, device_budget_bytes = 0;
  // This rank's fp32 master weights and Adam moments (12 bytes a parameter of its part).
  uint64_t optimizer_state_bytes = 0;
  // ... of which in host memory and on NVMe (--placement), and the placement in words.
  uint64_t optimizer_state_memory_bytes = 0, optimizer_state_nvme_bytes = 0;
  std::string placement;
  // This rank's gradient shards (the accumulated gradients, in the host tier or spilled).
  uint64_t gradient_bytes = 0;
  // This rank's 16-bit weight shards (2 bytes a parameter; with ZeRO-3 its chunks, / world).
  uint64_t param16_bytes = 0;
  // ... of which derived from the master weights in memory (never on NVMe: executor.h).
  uint64_t param16_derived_bytes = 0;
  // The swap file this rank reserved (fallocate) on its NVMe directories; 0 without NVMe.
  uint64_t swap_file_bytes = 0;
  uint64_t peak_pinned_bytes = 0, pinned_budget_bytes = 0;
  std::string device, backend, io_engine;
  // --profile: each bound measured alone in the same run, and the step over their max.
  double compute_bound_seconds = 0, io_bound_seconds = 0, adam_bound_seconds = 0;
  double comm_bound_seconds = 0;  // across ranks: the step's collectives alone
  double step_over_bound = 0;
  // Where the executor's time went, per step (medians are not kept: totals / steps).
  double compute_seconds = 0, stall_seconds = 0, grad_seconds = 0, optimizer_seconds = 0;
  double optimizer_wait_seconds = 0;  // of stall_seconds: waiting for the optimizer's weights
  double adam_seconds = 0;  // of optimizer_seconds: the CPU Adam kernel busy
  // Checkpoints (zinf.checkpoint): committed by this run, the last one's directory, the writer
  // thread's time (overlapping training) and the bytes it wrote (state in memory; state on NVMe
  // is named, not copied). A resumed run's step counts start at the checkpoint's step.
  uint64_t checkpoints = 0, checkpoint_bytes_written = 0, resumed_from_step = 0;
  std::string last_checkpoint;
  double checkpoint_writer_seconds = 0;
  // Median step time of the steps a commit overlapped (each checkpoint's next step) and of the
  // others, leaving out the run's first and last steps (not comparable); with compare_checkpoint_copy, the plain copies' count, bytes and seconds in all.
  double checkpoint_step_seconds_median = 0, other_step_seconds_median = 0;
  uint64_t plain_copies = 0, plain_copy_bytes = 0;
  double plain_copy_seconds = 0;
  bool stopped = false;  // ended early by a stop request (after committing a checkpoint)
  // Across ranks (zinf launch): this rank, the world, the bytes this rank put on the wire and
  // took off it per step (every collective), of which the gradients' reduction sent, and the
  // time in the gradients' and weights' collectives. tokens_per_step and tokens_per_s are the
  // whole job's.
  int rank = 0, world = 1;
  std::string transport;
  double comm_sent_bytes_per_step = 0, comm_received_bytes_per_step = 0;
  double grad_comm_sent_bytes_per_step = 0, comm_seconds = 0;
  std::string ToJson() const;
};

Result<TrainSummary> Train(const TrainOptions& options);

}  // namespace zinf::train
