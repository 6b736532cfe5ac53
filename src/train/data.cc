#include "src/train/data.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "src/base/log.h"

namespace zinf::train {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t Mix(uint64_t z) {  // the SplitMix64 finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t ValidationTokens(uint64_t size, double val_fraction) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(size) * val_fraction));
}

// Each split that should hold tokens holds `need` (val_fraction 1: all of them validate).
bool SplitsFit(uint64_t size, double val_fraction, uint64_t need) {
  const uint64_t val = ValidationTokens(size, val_fraction);
  return (val_fraction == 1.0 || size - val >= need) && (val_fraction == 0.0 || val >= need);
}

// The smallest size whose splits both hold `need` tokens.
uint64_t TokensNeeded(double val_fraction, uint64_t need) {
  double estimate = static_cast<double>(need);
  if (val_fraction > 0.0) estimate = std::max(estimate, need / val_fraction);
  if (val_fraction < 1.0) estimate = std::max(estimate, need / (1.0 - val_fraction));
  uint64_t n = static_cast<uint64_t>(estimate);
  n = n > 2 ? n - 2 : 0;
  while (!SplitsFit(n, val_fraction, need)) ++n;
  return n;
}

// Sizes are spoken in bytes for text (tokens are bytes), in tokens otherwise.
const char* Unit(uint32_t token_bytes) { return token_bytes == 1 ? "bytes" : "tokens"; }

// Row `n` tokens: inputs p[0..n), targets p[1..n].
template <typename Load>
void FillRow(Load load, uint64_t start, uint32_t n, int32_t* in, int32_t* out) {
  for (uint32_t t = 0; t < n; ++t) {
    in[t] = load(start + t);
    out[t] = load(start + t + 1);
  }
}

}  // namespace

std::string_view SplitName(Split split) { return split == Split::kTrain ? "train" : "validation"; }

// ---- TokenCorpus ------------------------------------------------------------------------------

Result<TokenCorpus> TokenCorpus::FromTokenFile(TokenFile file, uint32_t vocab, uint32_t seq_len,
                                               double val_fraction) {
  const std::string source = file.source().path;
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("corpus {}: {}", source, what));
  };
  if (vocab < 2) return bad(fmt::format("vocab {}; expected >= 2", vocab));
  if (seq_len == 0) return bad("seq_len 0; expected >= 1");
  if (!(val_fraction >= 0.0 && val_fraction <= 1.0)) {
    return bad(fmt::format("val_fraction {}; expected a number in [0, 1]", val_fraction));
  }
  const uint64_t need = uint64_t{seq_len} + 1, size = file.tokens();
  const char* unit = Unit(file.token_bytes());
  if (!SplitsFit(size, val_fraction, need)) {
    const uint64_t val = ValidationTokens(size, val_fraction);
    if (val_fraction == 1.0) {
      return bad(fmt::format(
          "{} {} is too small: the validation split (the whole file) needs seq_len + 1 = {} {}",
          size, unit, need, unit));
    }
    return bad(fmt::format(
        "{} {} is too small: with val_fraction {} the training split gets {} {} and the "
        "validation split {}; each needs seq_len + 1 = {} {}, so the corpus needs at least {} {}",
        size, unit, val_fraction, size - val, unit, val, need, unit,
        TokensNeeded(val_fraction, need), unit));
  }
  TokenCorpus c(std::move(file));
  ZINF_ASSIGN_OR_RETURN(c.scan_seconds_, c.file_.CheckVocab(vocab));
  c.train_size_ = size - ValidationTokens(size, val_fraction);
  c.vocab_ = vocab;
  return c;
}

Result<TokenCorpus> TokenCorpus::FromBytes(std::string source, std::string bytes, uint32_t vocab,
                                           uint32_t seq_len, double val_fraction) {
  return FromTokenFile(TokenFile::FromBytes(std::move(source), std::move(bytes)), vocab, seq_len,
                       val_fraction);
}

Result<TokenCorpus> TokenCorpus::FromFile(const std::string& path, uint32_t vocab, uint32_t seq_len,
                                          double val_fraction, DataFormat format) {
  ZINF_ASSIGN_OR_RETURN(TokenFile file, TokenFile::Open(path, format));
  return FromTokenFile(std::move(file), vocab, seq_len, val_fraction);
}

Result<TokenCorpus> TokenCorpus::Synthetic(uint64_t seed, uint64_t bytes, uint32_t vocab,
                                           uint32_t seq_len, double val_fraction) {
  return FromBytes(fmt::format("synthetic(seed={})", seed), SyntheticText(seed, bytes), vocab,
                   seq_len, val_fraction);
}

int32_t TokenCorpus::token(uint64_t index) const {
  return LoadToken(file_.token_data(), file_.token_bytes(), index);
}

std::string TokenCorpus::SyntheticText(uint64_t seed, uint64_t bytes) {
  std::mt19937_64 rng(seed);
  std::string text;
  text.reserve(bytes + 16);
  while (text.size() < bytes) {
    const uint64_t op = rng() % 3;
    const uint64_t m = op == 2 ? 100 : 1000;
    uint64_t a = rng() % m;
    uint64_t b = rng() % m;
    uint64_t c = 0;
    char sign = '+';
    if (op == 0) {
      c = a + b;
    } else if (op == 1) {
      if (a < b) std::swap(a, b);
      c = a - b;
      sign = '-';
    } else {
      c = a * b;
      sign = '*';
    }
    text += fmt::format("{}{}{}={}\n", a, sign, b, c);
  }
  text.resize(bytes);
  return text;
}

// ---- LoadTrainingData -------------------------------------------------------------------------

namespace {

// "train.bin (nanogpt, 4000 tokens; 3600 for training, vocabulary scan 0.1 ms)"; the scan's rate
// for files of 64 MiB and more.
std::string DescribeSplit(const TokenCorpus& c, Split split) {
  const DataSource& d = c.description();
  std::string scan;
  if (c.scan_seconds() > 0) {
    scan = fmt::format(", vocabulary scan {:.1f} ms", 1e3 * c.scan_seconds());
    if (d.file_bytes >= (64u << 20)) {
      scan += fmt::format(" at {:.2f} GB/s",
                          static_cast<double>(d.file_bytes) / c.scan_seconds() / 1e9);
    }
  }
  return fmt::format("{} ({}, {} tokens; {} for {}{})", d.path, DataFormatName(d.format), d.tokens,
                     c.split_size(split), split == Split::kTrain ? "training" : "validation", scan);
}

}  // namespace

Result<TrainingData> LoadTrainingData(const DataOptions& o, uint32_t vocab, uint32_t seq_len) {
  const bool val_file = !o.val_path.empty();
  const double train_val_fraction = val_file ? 0.0 : o.val_fraction;
  ZINF_ASSIGN_OR_RETURN(
      TokenCorpus train,
      o.path.empty()
          ? TokenCorpus::Synthetic(o.seed, o.synthetic_bytes, vocab, seq_len, train_val_fraction)
          : TokenCorpus::FromFile(o.path, vocab, seq_len, train_val_fraction, o.format));
  if (!val_file) {
    Log().info("train: data {}; validation: its last {} tokens",
               DescribeSplit(train, Split::kTrain), train.split_size(Split::kValidation));
    TokenCorpus validation = train;
    return TrainingData{std::move(train), std::move(validation)};
  }
  ZINF_ASSIGN_OR_RETURN(TokenCorpus validation,
                        TokenCorpus::FromFile(o.val_path, vocab, seq_len, 1.0, o.format));
  Log().info("train: data {}; validation: {}", DescribeSplit(train, Split::kTrain),
             DescribeSplit(validation, Split::kValidation));
  return TrainingData{std::move(train), std::move(validation)};
}

// ---- BatchSampler -----------------------------------------------------------------------------

Result<BatchSampler> BatchSampler::Create(const TokenCorpus& corpus, Split split, uint32_t batch,
                                          uint32_t seq_len, uint64_t seed) {
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("batch sampler over corpus {} ({} split): {}",
                                       corpus.source(), SplitName(split), what));
  };
  if (batch == 0) return bad("batch size 0; expected >= 1");
  if (seq_len == 0) return bad("seq_len 0; expected >= 1");
  const uint64_t size = corpus.split_size(split);
  const char* unit = Unit(corpus.file_.token_bytes());
  if (size < uint64_t{seq_len} + 1) {
    return bad(
        fmt::format("the split holds {} {}; a sequence of {} tokens with its targets "
                    "needs {}",
                    size, unit, seq_len, uint64_t{seq_len} + 1));
  }
  BatchSampler s;
  s.buffer_ = corpus.file_.buffer();
  s.tokens_ = corpus.file_.token_data();
  s.token_bytes_ = corpus.file_.token_bytes();
  s.source_ = corpus.description();
  s.begin_ = corpus.split_begin(split);
  s.split_ = split;
  s.batch_ = batch;
  s.seq_len_ = seq_len;
  s.seed_ = seed;
  s.starts_ = size - seq_len;
  return s;
}

uint64_t BatchSampler::Start(uint64_t index, uint32_t row) const {
  const uint64_t k = index * batch_ + row + 1;
  const uint64_t x = Mix(seed_ + k * kGolden);
  const uint64_t pick = static_cast<uint64_t>((static_cast<unsigned __int128>(x) * starts_) >> 64);
  return begin_ + pick;
}

void BatchSampler::Fill(uint64_t index, int32_t* inputs, int32_t* targets) const {
  const unsigned char* p = tokens_;
  for (uint32_t r = 0; r < batch_; ++r) {
    const uint64_t start = Start(index, r);
    int32_t* in = inputs + uint64_t{r} * seq_len_;
    int32_t* out = targets + uint64_t{r} * seq_len_;
    if (token_bytes_ == 1) {
      FillRow([p](uint64_t i) { return LoadToken(p, 1, i); }, start, seq_len_, in, out);
    } else {
      FillRow([p](uint64_t i) { return LoadToken(p, 2, i); }, start, seq_len_, in, out);
    }
  }
}

void BatchSampler::Next(int32_t* inputs, int32_t* targets) { Fill(position_++, inputs, targets); }

}  // namespace zinf::train
