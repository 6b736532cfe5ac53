// src/train/data.h — token sources for byte-level training.
//
// Contract:
// - A TextCorpus is a byte string whose bytes are the tokens (int32 values 0..255). The last
//   floor(size × val_fraction) bytes are the validation split, the bytes before them the
//   training split. Each split must hold one sequence and its next-token targets, seq_len + 1
//   bytes (the validation split only when val_fraction > 0). When vocab < 256, a byte >= vocab
//   is refused, naming its offset and value; with vocab >= 256 every byte is a valid token.
//   Refusals are InvalidArgument and name the source (the path), the sizes and what is needed.
// - TextCorpus::Synthetic is a built-in corpus with learnable structure, the same bytes for the
//   same (seed, bytes) on every platform. SyntheticText spells it out: from std::mt19937_64(seed)
//   (whose output sequence the C++ standard fixes), each line draws, in this order,
//     op = rng() % 3                        0: '+', 1: '-', 2: '*'
//     a = rng() % M, b = rng() % M           M = 100 for '*', 1000 otherwise
//   and for '-' swaps a and b when a < b, so c = a - b >= 0; '+' gives a + b, '*' a × b. The
//   line is "<a><op><b>=<c>\n" in decimal without spaces ("37+485=522\n", "12*7=84\n"). Lines
//   are appended until `bytes` bytes are reached and the text is cut at exactly `bytes`. Its
//   bytes are '0'..'9', '+', '-', '*', '=', '\n' (largest 61, '='): vocab must be >= 62.
// - A BatchSampler draws batches of `batch` rows × `seq_len` tokens from one split. Row r of
//   batch i starts at a split offset drawn from the (i × batch + r + 1)-th output of SplitMix64
//   seeded with `seed` (x_k = mix(seed + k × 0x9E3779B97F4A7C15), mix the SplitMix64
//   finalizer), mapped onto the split_size - seq_len valid starts by the 128-bit multiply-high
//   (x × count) >> 64. inputs[r][t] = corpus[start + t], targets[r][t] = corpus[start + t + 1]:
//   every byte read lies inside the split, so training never reads validation bytes. Batch i is a
//   pure function of (corpus, split, batch, seq_len, seed, i): Fill(i) is random access, Next()
//   is Fill(position++) and Seek() moves the position (resume; Seek(0) before each evaluation
//   gives the validation loss the same batches every time).
//
// Thread-safety: a TextCorpus is immutable; copies share its bytes and may be read from any
// thread. A BatchSampler's const methods may run concurrently; Next and Seek need one caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::train {

enum class Split { kTrain, kValidation };
std::string_view SplitName(Split split);  // "train", "validation"

class TextCorpus {
 public:
  // The bytes of the file at `path`.
  static Result<TextCorpus> FromFile(const std::string& path, uint32_t vocab, uint32_t seq_len,
                                     double val_fraction = 0.1);
  // SyntheticText(seed, bytes), named "synthetic(seed=<seed>)".
  static Result<TextCorpus> Synthetic(uint64_t seed, uint64_t bytes, uint32_t vocab,
                                      uint32_t seq_len, double val_fraction = 0.1);
  // `bytes` as given; `source` names it in messages.
  static Result<TextCorpus> FromBytes(std::string source, std::string bytes, uint32_t vocab,
                                      uint32_t seq_len, double val_fraction = 0.1);
  // The synthetic arithmetic text described above.
  static std::string SyntheticText(uint64_t seed, uint64_t bytes);

  const std::string& source() const { return source_; }
  uint32_t vocab() const { return vocab_; }
  uint64_t size() const { return bytes_->size(); }
  uint64_t split_begin(Split split) const { return split == Split::kTrain ? 0 : train_size_; }
  uint64_t split_size(Split split) const {
    return split == Split::kTrain ? train_size_ : size() - train_size_;
  }
  int32_t token(uint64_t offset) const { return static_cast<unsigned char>((*bytes_)[offset]); }
  const std::string& bytes() const { return *bytes_; }

 private:
  friend class BatchSampler;
  TextCorpus() = default;

  std::string source_;
  std::shared_ptr<const std::string> bytes_;
  uint64_t train_size_ = 0;
  uint32_t vocab_ = 0;
};

class BatchSampler {
 public:
  // Refused: batch or seq_len 0, a split shorter than seq_len + 1 bytes.
  static Result<BatchSampler> Create(const TextCorpus& corpus, Split split, uint32_t batch,
                                     uint32_t seq_len, uint64_t seed);

  // Fills batch × seq_len inputs and targets (row-major) with batch number position(), then
  // advances the position.
  void Next(int32_t* inputs, int32_t* targets);
  // Fills batch number `index`; the position is untouched.
  void Fill(uint64_t index, int32_t* inputs, int32_t* targets) const;
  // The corpus offset where row `row` of batch `index` starts.
  uint64_t Start(uint64_t index, uint32_t row) const;

  uint64_t position() const { return position_; }
  void Seek(uint64_t index) { position_ = index; }

  Split split() const { return split_; }
  uint32_t batch() const { return batch_; }
  uint32_t seq_len() const { return seq_len_; }
  uint64_t tokens_per_batch() const { return uint64_t{batch_} * seq_len_; }

 private:
  BatchSampler() = default;

  std::shared_ptr<const std::string> bytes_;  // the corpus's bytes, shared
  uint64_t begin_ = 0;                        // the split's first byte
  Split split_ = Split::kTrain;
  uint32_t batch_ = 0;
  uint32_t seq_len_ = 0;
  uint64_t seed_ = 0;
  uint64_t starts_ = 0;  // valid start offsets in the split: split_size - seq_len
  uint64_t position_ = 0;
};

}  // namespace zinf::train
