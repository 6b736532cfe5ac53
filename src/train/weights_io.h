// src/train/weights_io.h — the model's weights in and out of safetensors files.
//
// Contract. SaveWeights writes every unit's fp32 master weights as F32 tensors named as
// nanoGPT's state_dict (gpt.h UnitTensors: "transformer.wte.weight", "transformer.h.0.ln_1.weight",
// ...; the tied lm_head is not stored, as in safetensors files Hugging Face writes), with the
// model dimensions in the metadata ("n_layer", "n_embd", "n_head", "vocab_size", "block_size").
// The file is written crash-consistently (temporary file, fsync, rename).
// ReadRecordedModel returns the model sizes a file records in that metadata (zinf.model's
// names: layers <- n_layer, width <- n_embd, heads <- n_head, seq_len <- block_size, vocab <-
// vocab_size); each is absent when the file does not record it (another tool's file may record
// none). A recorded size that is not a decimal integer in zinf.model's range is refused naming
// the file, the key and the value.
// LoadWeights reads such a file into the executor: a size the file records must equal the
// executor's (refused naming the key and both values: the head count does not show in the
// shapes); every tensor of the model must be present with its exact shape, as F32, BF16 or F16
// (widened to fp32); a missing tensor, a wrong shape or dtype, or a tensor the model does not
// have (except "lm_head.weight", which must then equal the token embedding's shape) is refused
// naming the file, the tensor and the model's sizes. Adam moments start at 0.
//
// Thread-safety: as the executor — one thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "src/train/executor.h"
#include "src/train/safetensors.h"
#include "zinf/status.h"

namespace zinf::train {

// The model sizes recorded in a weights file (see above).
struct RecordedModel {
  std::optional<uint32_t> layers, width, heads, seq_len, vocab;

  bool empty() const { return !layers && !width && !heads && !seq_len && !vocab; }
};

// write = false: the weights are gathered (with a partitioned optimizer state every rank must
// take part, executor.h) but no file is written (the ranks but rank 0).
Status SaveWeights(LayerExecutor& executor, const std::string& path, bool write = true);
// The metadata SaveWeights writes: format, writer, and the model sizes.
SafetensorsMetadata WeightsMetadata(const GptDims& dims);
Result<RecordedModel> ReadRecordedModel(const std::string& path);
Status LoadWeights(LayerExecutor& executor, const std::string& path);

}  // namespace zinf::train
