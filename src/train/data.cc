#include "src/train/data.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <random>
#include <utility>

namespace zinf::train {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;

uint64_t Mix(uint64_t z) {  // the SplitMix64 finalizer
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t ValidationBytes(uint64_t size, double val_fraction) {
  return static_cast<uint64_t>(std::floor(static_cast<double>(size) * val_fraction));
}

bool SplitsFit(uint64_t size, double val_fraction, uint64_t need) {
  uint64_t val = ValidationBytes(size, val_fraction);
  return size - val >= need && (val_fraction == 0.0 || val >= need);
}

// The smallest size whose splits both hold `need` bytes.
uint64_t BytesNeeded(double val_fraction, uint64_t need) {
  double estimate = static_cast<double>(need);
  if (val_fraction > 0.0) estimate = std::max(estimate, need / val_fraction);
  estimate = std::max(estimate, need / (1.0 - val_fraction));
  uint64_t n = static_cast<uint64_t>(estimate);
  n = n > 2 ? n - 2 : 0;
  while (!SplitsFit(n, val_fraction, need)) ++n;
  return n;
}

Result<std::string> ReadFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::FromErrno(errno, "open corpus file " + path);
  std::string out;
  struct stat st;
  if (::fstat(fd, &st) == 0 && st.st_size > 0) out.reserve(static_cast<size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t r = ::read(fd, buf, sizeof(buf));
    if (r < 0) {
      if (errno == EINTR) continue;
      Status s =
          Status::FromErrno(errno, fmt::format("read corpus file {} offset {}", path, out.size()));
      ::close(fd);
      return s;
    }
    if (r == 0) break;
    out.append(buf, static_cast<size_t>(r));
  }
  ::close(fd);
  return out;
}

}  // namespace

std::string_view SplitName(Split split) { return split == Split::kTrain ? "train" : "validation"; }

// ---- TextCorpus -------------------------------------------------------------------------------

Result<TextCorpus> TextCorpus::FromBytes(std::string source, std::string bytes, uint32_t vocab,
                                         uint32_t seq_len, double val_fraction) {
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("corpus {}: {}", source, what));
  };
  if (vocab < 2) return bad(fmt::format("vocab {}; expected >= 2", vocab));
  if (seq_len == 0) return bad("seq_len 0; expected >= 1");
  if (!(val_fraction >= 0.0 && val_fraction < 1.0)) {
    return bad(fmt::format("val_fraction {}; expected a number in [0, 1)", val_fraction));
  }
  const uint64_t need = uint64_t{seq_len} + 1;
  if (!SplitsFit(bytes.size(), val_fraction, need)) {
    uint64_t val = ValidationBytes(bytes.size(), val_fraction);
    return bad(fmt::format(
        "{} bytes is too small: with val_fraction {} the training split gets {} bytes and the "
        "validation split {}; each needs seq_len + 1 = {} bytes, so the corpus needs at least "
        "{} bytes",
        bytes.size(), val_fraction, bytes.size() - val, val, need,
        BytesNeeded(val_fraction, need)));
  }
  if (vocab < 256) {
    for (size_t i = 0; i < bytes.size(); ++i) {
      unsigned value = static_cast<unsigned char>(bytes[i]);
      if (value >= vocab) {
        return bad(
            fmt::format("byte at offset {} is {}, not a token of the vocabulary of {} "
                        "(tokens are bytes; expected every byte < {})",
                        i, value, vocab, vocab));
      }
    }
  }
  TextCorpus c;
  c.source_ = std::move(source);
  c.train_size_ = bytes.size() - ValidationBytes(bytes.size(), val_fraction);
  c.bytes_ = std::make_shared<const std::string>(std::move(bytes));
  c.vocab_ = vocab;
  return c;
}

Result<TextCorpus> TextCorpus::FromFile(const std::string& path, uint32_t vocab, uint32_t seq_len,
                                        double val_fraction) {
  ZINF_ASSIGN_OR_RETURN(std::string bytes, ReadFile(path));
  return FromBytes(path, std::move(bytes), vocab, seq_len, val_fraction);
}

Result<TextCorpus> TextCorpus::Synthetic(uint64_t seed, uint64_t bytes, uint32_t vocab,
                                         uint32_t seq_len, double val_fraction) {
  return FromBytes(fmt::format("synthetic(seed={})", seed), SyntheticText(seed, bytes), vocab,
                   seq_len, val_fraction);
}

std::string TextCorpus::SyntheticText(uint64_t seed, uint64_t bytes) {
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

// ---- BatchSampler -----------------------------------------------------------------------------

Result<BatchSampler> BatchSampler::Create(const TextCorpus& corpus, Split split, uint32_t batch,
                                          uint32_t seq_len, uint64_t seed) {
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("batch sampler over corpus {} ({} split): {}",
                                       corpus.source(), SplitName(split), what));
  };
  if (batch == 0) return bad("batch size 0; expected >= 1");
  if (seq_len == 0) return bad("seq_len 0; expected >= 1");
  const uint64_t size = corpus.split_size(split);
  if (size < uint64_t{seq_len} + 1) {
    return bad(
        fmt::format("the split holds {} bytes; a sequence of {} tokens with its targets "
                    "needs {}",
                    size, seq_len, uint64_t{seq_len} + 1));
  }
  BatchSampler s;
  s.bytes_ = corpus.bytes_;
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
  const auto* bytes = reinterpret_cast<const unsigned char*>(bytes_->data());
  for (uint32_t r = 0; r < batch_; ++r) {
    const unsigned char* p = bytes + Start(index, r);
    int32_t* in = inputs + uint64_t{r} * seq_len_;
    int32_t* out = targets + uint64_t{r} * seq_len_;
    for (uint32_t t = 0; t < seq_len_; ++t) {
      in[t] = p[t];
      out[t] = p[t + 1];
    }
  }
}

void BatchSampler::Next(int32_t* inputs, int32_t* targets) { Fill(position_++, inputs, targets); }

}  // namespace zinf::train
