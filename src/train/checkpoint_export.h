// src/train/checkpoint_export.h — what `zinf ckpt` reads out of a checkpoint written by
// `zinf train` (src/train/checkpoint.h): a summary (inspect) and one consolidated safetensors
// file (export), whether the state lived in the checkpoint directory or in the run's swap file.
//
// Contract.
// - Describe(manifest) says what the checkpoint holds: step, model and its parameter count,
//   precision, where the optimizer state lives, the data position, the loss scale, and the bytes
//   per role and per tier ("nvme": extents of the run's swap file; "checkpoint": files in its
//   directory). It reads no shard.
// - Export(manifest, options) writes `out` as safetensors: every weight under nanoGPT's name
//   (gpt.h UnitTensors, as --save writes them) from the fp32 master weights, as F32 or BF16
//   (rounded to nearest even), with the model sizes in the metadata as --save records them
//   (so `zinf train --init` takes it, and an F32 export of a run's final checkpoint is the same
//   bytes as that run's --save). With optimizer_state, also "<name>.exp_avg" and
//   "<name>.exp_avg_sq" (always F32; such a file is for other tools: --init refuses names the
//   model does not have). Unless verify is false, every shard's xxHash64 is checked first
//   (ckpt::Verify: DataLoss naming the first bad shard, its file and offset; nothing written).
//   The file is written crash-consistently through one buffer of kSafetensorsFillBytes (8 MiB)
//   plus its fp32 staging (16 MiB for BF16): peak memory does not grow with the model.
//
// - A checkpoint of a PyTorch module (zinf.torch's save_checkpoint; manifest model kind
//   "torch", python/zinf/torch/_checkpoint.py) is described and exported by the *Torch
//   functions, which Describe and Export call for it: every parameter under the module's own
//   name (state_dict's keys; a tied weight under its first), from the fp32 master (trainable)
//   or the stored working copy (frozen), as F32 or BF16; the moments as "<name>.exp_avg" and
//   "<name>.exp_avg_sq" (F32) for trainable ones (checkpoint_export_torch.cc).
//
// Thread-safety: plain functions; they only read the checkpoint (Export writes `out`).
#pragma once

#include <cstdint>
#include <string>

#include "src/ckpt/manifest.h"
#include "src/train/safetensors.h"
#include "zinf/status.h"

namespace zinf::train {

Result<std::string> Describe(const ckpt::Manifest& manifest);

bool IsTorchCheckpoint(const ckpt::Manifest& manifest);

struct ExportOptions {
  std::string out;
  Dtype dtype = Dtype::kF32;  // of the weights: kF32 or kBF16
  bool optimizer_state = false;
  bool verify = true;
};

struct ExportStats {
  uint64_t tensors = 0;
  uint64_t bytes = 0;  // of the file
  double verify_seconds = 0, write_seconds = 0;
};

Result<ExportStats> Export(const ckpt::Manifest& manifest, const ExportOptions& options);

Result<std::string> DescribeTorch(const ckpt::Manifest& manifest);
Result<ExportStats> ExportTorch(const ckpt::Manifest& manifest, const ExportOptions& options);

}  // namespace zinf::train
