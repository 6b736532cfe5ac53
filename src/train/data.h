// src/train/data.h — token corpora (a file in one of the formats of token_file.h, or the
// built-in synthetic text), their splits, and the batch sampler.
//
// Contract:
// - A TokenCorpus is the tokens of one TokenFile: bytes (text) or little-endian uint16 (nanoGPT,
//   llm.c), read in place from the file's read-only mapping. The last floor(tokens ×
//   val_fraction) tokens are the validation split, the tokens before them the training split;
//   val_fraction 1 makes the whole corpus the validation split (a separate validation file). Each
//   non-empty split must hold one sequence and its next-token targets, seq_len + 1 tokens (the
//   validation split only when val_fraction > 0, the training split only when val_fraction < 1).
//   The layout is checked first (token_file.h), then the sizes, then every token is checked
//   once against the vocabulary, before any batch is drawn (TokenFile::CheckVocab: a token >=
//   vocab is refused naming the file, its byte offset and its value; text with vocab >= 256
//   and uint16 tokens with vocab >= 65536 need no scan). Refusals name the source (the path),
//   the sizes (in bytes for text, tokens otherwise) and what is needed.
// - LoadTrainingData builds what `zinf train` reads: the training corpus (the --data file, else
//   the synthetic text) and the corpus validation batches come from: with a validation file
//   (--val-data) that file whole, and the training corpus is not split (val_fraction 0);
//   without one, the training corpus itself (its held-out tail).
// - TokenCorpus::Synthetic is a built-in corpus with learnable structure, the same bytes for the
//   same (seed, bytes) on every platform. SyntheticText spells it out: from std::mt19937_64(seed)
//   (whose output sequence the C++ standard fixes), each line draws, in this order,
//     op = rng() % 3                        0: '+', 1: '-', 2: '*'
//     a = rng() % M, b = rng() % M           M = 100 for '*', 1000 otherwise
//   and for '-' swaps a and b when a < b, so c = a - b >= 0; '+' gives a + b, '*' a × b. The
//   line is "<a><op><b>=<c>\n" in decimal without spaces ("37+485=522\n", "12*7=84\n"). Lines
//   are appended until `bytes` bytes are reached and the text is cut at exactly `bytes`. Its
//   bytes are '0'..'9', '+', '-', '*', '=', '\n' (largest 61, '='): vocab must be >= 62.
// - A BatchSampler draws batches of `batch` rows × `seq_len` tokens from one split. Row r of
//   batch i starts at a split offset (in tokens) drawn from the (i × batch + r + 1)-th output of
//   SplitMix64 seeded with `seed` (x_k = mix(seed + k × 0x9E3779B97F4A7C15), mix the SplitMix64
//   finalizer), mapped onto the split_size - seq_len valid starts by the 128-bit multiply-high
//   (x × count) >> 64. inputs[r][t] = token(start + t), targets[r][t] = token(start + t + 1):
//   every token read lies inside the split, so training never reads validation tokens. Batch i
//   is a pure function of (corpus, split, batch, seq_len, seed, i): Fill(i) is random access,
//   Next() is Fill(position++) and Seek() moves the position (resume; Seek(0) before each
//   evaluation gives the validation loss the same batches every time). For a resume, source()
//   describes the data (format, path, token count, size and fingerprint; DataSource::CheckSameAs
//   compares two) and position() is the next batch.
//
// Thread-safety: a TokenCorpus is immutable; copies share its mapping and may be read from any
// thread. A BatchSampler's const methods may run concurrently; Next and Seek need one caller.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "src/train/token_file.h"
#include "zinf/status.h"

namespace zinf::train {

enum class Split { kTrain, kValidation };
std::string_view SplitName(Split split);  // "train", "validation"

class TokenCorpus {
 public:
  // The tokens of the file at `path`, in `format` (kAuto: see token_file.h).
  static Result<TokenCorpus> FromFile(const std::string& path, uint32_t vocab, uint32_t seq_len,
                                      double val_fraction = 0.1,
                                      DataFormat format = DataFormat::kAuto);
  // SyntheticText(seed, bytes), named "synthetic(seed=<seed>)".
  static Result<TokenCorpus> Synthetic(uint64_t seed, uint64_t bytes, uint32_t vocab,
                                       uint32_t seq_len, double val_fraction = 0.1);
  // `bytes` as given (text: bytes are tokens); `source` names it in messages.
  static Result<TokenCorpus> FromBytes(std::string source, std::string bytes, uint32_t vocab,
                                       uint32_t seq_len, double val_fraction = 0.1);
  // An opened file's tokens, checked as the contract says.
  static Result<TokenCorpus> FromTokenFile(TokenFile file, uint32_t vocab, uint32_t seq_len,
                                           double val_fraction = 0.1);
  // The synthetic arithmetic text described above.
  static std::string SyntheticText(uint64_t seed, uint64_t bytes);

  const std::string& source() const { return file_.source().path; }
  const DataSource& description() const { return file_.source(); }
  DataFormat format() const { return file_.format(); }
  uint32_t vocab() const { return vocab_; }
  double scan_seconds() const { return scan_seconds_; }  // the vocabulary scan's time
  uint64_t size() const { return file_.tokens(); }       // in tokens
  uint64_t split_begin(Split split) const { return split == Split::kTrain ? 0 : train_size_; }
  uint64_t split_size(Split split) const {
    return split == Split::kTrain ? train_size_ : size() - train_size_;
  }
  int32_t token(uint64_t index) const;

 private:
  friend class BatchSampler;
  explicit TokenCorpus(TokenFile file) : file_(std::move(file)) {}

  TokenFile file_;
  uint64_t train_size_ = 0;
  uint32_t vocab_ = 0;
  double scan_seconds_ = 0;
};

// What `zinf train` reads (see the contract above).
struct DataOptions {
  std::string path;                       // empty: the synthetic corpus
  std::string val_path;                   // empty: the training corpus's tail validates
  DataFormat format = DataFormat::kAuto;  // for both files
  uint64_t synthetic_bytes = 4 << 20;
  uint64_t seed = 0;          // of the synthetic corpus
  double val_fraction = 0.1;  // without val_path
};
struct TrainingData {
  TokenCorpus train;       // its training split trains
  TokenCorpus validation;  // its validation split validates (maybe `train` itself)
};
Result<TrainingData> LoadTrainingData(const DataOptions& options, uint32_t vocab, uint32_t seq_len);

class BatchSampler {
 public:
  // Refused: batch or seq_len 0, a split shorter than seq_len + 1 tokens.
  static Result<BatchSampler> Create(const TokenCorpus& corpus, Split split, uint32_t batch,
                                     uint32_t seq_len, uint64_t seed);

  // Fills batch × seq_len inputs and targets (row-major) with batch number position(), then
  // advances the position.
  void Next(int32_t* inputs, int32_t* targets);
  // Fills batch number `index`; the position is untouched.
  void Fill(uint64_t index, int32_t* inputs, int32_t* targets) const;
  // The corpus token index where row `row` of batch `index` starts.
  uint64_t Start(uint64_t index, uint32_t row) const;

  uint64_t position() const { return position_; }
  void Seek(uint64_t index) { position_ = index; }

  const DataSource& source() const { return source_; }
  Split split() const { return split_; }
  uint64_t split_begin() const { return begin_; }
  uint64_t split_size() const { return starts_ + seq_len_; }
  uint32_t batch() const { return batch_; }
  uint32_t seq_len() const { return seq_len_; }
  uint64_t seed() const { return seed_; }
  uint64_t tokens_per_batch() const { return uint64_t{batch_} * seq_len_; }

 private:
  BatchSampler() = default;

  std::shared_ptr<const TokenBuffer> buffer_;  // the corpus's bytes, shared
  const unsigned char* tokens_ = nullptr;      // its first token, in buffer_
  uint32_t token_bytes_ = 1;                   // 1 (text) or 2 (uint16)
  DataSource source_;
  uint64_t begin_ = 0;  // the split's first token
  Split split_ = Split::kTrain;
  uint32_t batch_ = 0;
  uint32_t seq_len_ = 0;
  uint64_t seed_ = 0;
  uint64_t starts_ = 0;  // valid start offsets in the split: split_size - seq_len
  uint64_t position_ = 0;
};

}  // namespace zinf::train
