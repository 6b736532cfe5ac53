#include "src/train/token_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "src/base/log.h"

// Header-only use of the xxHash library (libxxhash-dev): nothing to link.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace zinf::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "token files are little-endian; a big-endian host would need byte swaps");

constexpr uint64_t kScanChunkBytes = 4 << 20;  // the vocabulary scan's pread size
constexpr uint64_t kNotFound = ~uint64_t{0};

// Reads exactly `n` bytes at `offset`; a file that ends first is DataLoss.
Status PreadAll(int fd, void* out, uint64_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(out);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, fmt::format("read data file {} offset {} length {}", path,
                                                  offset + done, n - done));
    }
    if (r == 0) {
      return DataLoss(
          fmt::format("data file {}: ended at byte {} while reading {} bytes at offset "
                      "{} (was it truncated while open?)",
                      path, offset + done, n, offset));
    }
    done += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

Result<uint64_t> HashRange(int fd, uint64_t offset, uint64_t n, const std::string& path) {
  std::string bytes(n, '\0');
  ZINF_RETURN_IF_ERROR(PreadAll(fd, bytes.data(), n, offset, path));
  return uint64_t{XXH64(bytes.data(), bytes.size(), 0)};
}

// The index of the first of `n` tokens >= vocab, or kNotFound. The maximum first: a loop the
// compiler vectorizes, so a clean file is scanned at memory speed.
template <typename T>
uint64_t FirstAtLeast(const T* p, uint64_t n, uint32_t vocab) {
  T most = 0;
  for (uint64_t i = 0; i < n; ++i) most = std::max(most, p[i]);
  if (most < vocab) return kNotFound;
  for (uint64_t i = 0; i < n; ++i) {
    if (p[i] >= vocab) return i;
  }
  return kNotFound;
}

std::string Describe(const std::string& path, DataFormat f) {
  return fmt::format("data file {} ({})", path, DataFormatName(f));
}

// The magic of another llm.c file kind, named; empty for anything else.
std::string_view OtherLlmcKind(int32_t magic) {
  if (magic == kLlmcLlama3Magic) return "llm.c's LLaMA 3 token files (uint32 tokens)";
  if (magic == kLlmcEvalMagic) return "llm.c's multiple-choice eval files (not training tokens)";
  return {};
}

Result<DataFormat> Resolve(const std::string& path, DataFormat asked, uint64_t size,
                           int32_t magic) {
  const bool has_magic = size >= 4;
  if (asked == DataFormat::kNanoGpt && has_magic && magic == kLlmcMagic) {
    Log().warn(
        "data file {}: starts with llm.c's magic {} but --data-format nanogpt reads it as "
        "raw uint16 tokens, header included, as asked",
        path, kLlmcMagic);
  }
  if (asked != DataFormat::kAuto) return asked;
  if (has_magic && magic == kLlmcMagic) return DataFormat::kLlmc;
  if (has_magic && !OtherLlmcKind(magic).empty()) {
    return InvalidArgument(fmt::format(
        "data file {}: starts with {}, the magic of {}, which zinf does not read (it reads llm.c's "
        "GPT-2 token files, magic {} version {}); to read the file as nanoGPT uint16 tokens or as "
        "text bytes anyway, name the format (--data-format nanogpt or text)",
        path, magic, OtherLlmcKind(magic), kLlmcMagic, kLlmcVersion));
  }
  if (path.ends_with(".bin")) return DataFormat::kNanoGpt;
  return DataFormat::kText;
}

// The token count an llm.c header declares, after checking it against the file's size.
Result<uint64_t> LlmcTokens(const std::string& path, const std::string& head, uint64_t size) {
  const std::string what = Describe(path, DataFormat::kLlmc);
  if (size < kLlmcHeaderBytes) {
    return DataLoss(
        fmt::format("{}: {} bytes, shorter than llm.c's header of 256 int32 ({} bytes): "
                    "the file is truncated",
                    what, size, kLlmcHeaderBytes));
  }
  int32_t header[3];
  std::memcpy(header, head.data(), sizeof header);
  if (header[0] != kLlmcMagic) {
    const std::string_view other = OtherLlmcKind(header[0]);
    return InvalidArgument(fmt::format(
        "{}: header[0] (magic) is {}; expected {}, the magic of llm.c's GPT-2 token files{}", what,
        header[0], kLlmcMagic,
        other.empty()
            ? ""
            : fmt::format(" ({} is the magic of {}, which zinf does not read)", header[0], other)));
  }
  if (header[1] != kLlmcVersion) {
    return InvalidArgument(fmt::format(
        "{}: header[1] (version) is {}; zinf reads version {} (uint16 tokens), the only version "
        "llm.c's dataloader accepts",
        what, header[1], kLlmcVersion));
  }
  if (header[2] <= 0) {
    return InvalidArgument(
        fmt::format("{}: header[2] (token count) is {}; expected a count > 0", what, header[2]));
  }
  const auto n = static_cast<uint64_t>(header[2]);
  const uint64_t expected = kLlmcHeaderBytes + 2 * n;
  if (size != expected) {
    return DataLoss(fmt::format(
        "{}: {} bytes, but header[2] says {} tokens, which take {} + 2 x {} = {} bytes: {}", what,
        size, n, kLlmcHeaderBytes, n, expected,
        size < expected ? fmt::format("the file is truncated ({} bytes missing)", expected - size)
                        : fmt::format("{} bytes follow the last token", size - expected)));
  }
  return n;
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::string_view DataFormatName(DataFormat format) {
  switch (format) {
    case DataFormat::kAuto:
      return "auto";
    case DataFormat::kText:
      return "text";
    case DataFormat::kNanoGpt:
      return "nanogpt";
    case DataFormat::kLlmc:
      return "llmc";
  }
  return "?";
}

Result<DataFormat> ParseDataFormat(std::string_view name) {
  for (DataFormat f :
       {DataFormat::kAuto, DataFormat::kText, DataFormat::kNanoGpt, DataFormat::kLlmc}) {
    if (name == DataFormatName(f)) return f;
  }
  return InvalidArgument(
      fmt::format("data format \"{}\"; expected auto, text, nanogpt or llmc", name));
}

// ---- DataSource -------------------------------------------------------------------------------

std::string DataSource::ToString() const {
  return fmt::format("{} {}: {} tokens, {} bytes, xxh64 head {:016x} tail {:016x}",
                     DataFormatName(format), path, tokens, file_bytes, head_xxh64, tail_xxh64);
}

Status DataSource::CheckSameAs(const DataSource& recorded) const {
  std::string diff;
  auto field = [&](const char* name, const std::string& now, const std::string& then) {
    if (now == then) return;
    diff += fmt::format("{}{} {} (recorded {})", diff.empty() ? "" : "; ", name, now, then);
  };
  field("format", std::string(DataFormatName(format)),
        std::string(DataFormatName(recorded.format)));
  field("tokens", std::to_string(tokens), std::to_string(recorded.tokens));
  field("size", fmt::format("{} bytes", file_bytes), fmt::format("{} bytes", recorded.file_bytes));
  field("xxh64 of the first MiB", fmt::format("{:016x}", head_xxh64),
        fmt::format("{:016x}", recorded.head_xxh64));
  field("xxh64 of the last MiB", fmt::format("{:016x}", tail_xxh64),
        fmt::format("{:016x}", recorded.tail_xxh64));
  if (diff.empty()) return Status::Ok();
  return FailedPrecondition(
      fmt::format("data {} is not the data recorded ({}): {}", path, recorded.path, diff));
}

DataSource DataSource::Fingerprint(std::string_view bytes) {
  DataSource d;
  d.file_bytes = bytes.size();
  const uint64_t n = std::min<uint64_t>(bytes.size(), kFingerprintBytes);
  d.head_xxh64 = XXH64(bytes.data(), n, 0);
  d.tail_xxh64 = XXH64(bytes.data() + bytes.size() - n, n, 0);
  return d;
}

// ---- TokenBuffer ------------------------------------------------------------------------------

std::shared_ptr<const TokenBuffer> TokenBuffer::Own(std::string bytes) {
  std::shared_ptr<TokenBuffer> b(new TokenBuffer);
  b->owned_ = std::move(bytes);
  b->data_ = reinterpret_cast<const unsigned char*>(b->owned_.data());
  b->size_ = b->owned_.size();
  return b;
}

TokenBuffer::~TokenBuffer() {
  if (map_ != nullptr) ::munmap(map_, size_);
  if (fd_ >= 0) ::close(fd_);
}

// ---- TokenFile --------------------------------------------------------------------------------

TokenFile TokenFile::FromBytes(std::string source, std::string bytes) {
  TokenFile f;
  f.source_ = DataSource::Fingerprint(bytes);
  f.source_.format = DataFormat::kText;
  f.source_.path = std::move(source);
  f.source_.tokens = bytes.size();
  f.buffer_ = TokenBuffer::Own(std::move(bytes));
  return f;
}

Result<TokenFile> TokenFile::Open(const std::string& path, DataFormat format) {
  FdCloser fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) return Status::FromErrno(errno, "open data file " + path);
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) return Status::FromErrno(errno, "stat data file " + path);
  if (!S_ISREG(st.st_mode)) {
    return InvalidArgument(fmt::format(
        "data file {}: not a regular file; zinf maps its data (copy the stream into a file)",
        path));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  std::string head(std::min(size, kLlmcHeaderBytes), '\0');
  ZINF_RETURN_IF_ERROR(PreadAll(fd.fd, head.data(), head.size(), 0, path));
  int32_t magic = 0;
  if (size >= 4) std::memcpy(&magic, head.data(), 4);
  ZINF_ASSIGN_OR_RETURN(const DataFormat resolved, Resolve(path, format, size, magic));

  TokenFile f;
  f.source_.format = resolved;
  f.source_.path = path;
  f.source_.file_bytes = size;
  switch (resolved) {
    case DataFormat::kText:
      f.source_.tokens = size;
      break;
    case DataFormat::kNanoGpt:
      if (size % 2 != 0) {
        return DataLoss(fmt::format(
            "{}: {} bytes is an odd size; nanoGPT files are uint16 tokens with no header (2 bytes "
            "a token): the file is truncated or holds something else (for bytes as tokens, "
            "--data-format text)",
            Describe(path, resolved), size));
      }
      f.token_bytes_ = 2;
      f.source_.tokens = size / 2;
      break;
    case DataFormat::kLlmc: {
      ZINF_ASSIGN_OR_RETURN(f.source_.tokens, LlmcTokens(path, head, size));
      f.token_bytes_ = 2;
      f.data_offset_ = kLlmcHeaderBytes;
      break;
    }
    case DataFormat::kAuto:
      return Internal("data format auto left unresolved");
  }
  const uint64_t n = std::min(size, kFingerprintBytes);
  ZINF_ASSIGN_OR_RETURN(f.source_.head_xxh64, HashRange(fd.fd, 0, n, path));
  ZINF_ASSIGN_OR_RETURN(f.source_.tail_xxh64, HashRange(fd.fd, size - n, n, path));

  std::shared_ptr<TokenBuffer> b(new TokenBuffer);
  if (size > 0) {
    void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
    if (m == MAP_FAILED) {
      return Status::FromErrno(errno, fmt::format("mmap data file {} ({} bytes)", path, size));
    }
    b->map_ = m;
    b->data_ = static_cast<const unsigned char*>(m);
    b->size_ = size;
  }
  b->fd_ = std::exchange(fd.fd, -1);
  f.buffer_ = std::move(b);
  return f;
}

Result<double> TokenFile::CheckVocab(uint32_t vocab) const {
  const uint32_t w = token_bytes_;
  if (vocab >= (uint64_t{1} << (8 * w))) return 0.0;  // every value is a token
  const auto t0 = std::chrono::steady_clock::now();
  auto refuse = [&](uint64_t index) -> Status {
    const uint64_t offset = data_offset_ + index * w;
    const int32_t value = LoadToken(token_data(), w, index);
    return InvalidArgument(fmt::format(
        "{}: token {} at byte offset {} (token index {}) is outside the vocabulary of {}{}; "
        "expected every token < {} (zinf.model.vocab, --vocab)",
        Describe(source_.path, format()), value, offset, index, vocab,
        w == 1 ? " (text: tokens are bytes)" : "", vocab));
  };
  auto first = [&](const unsigned char* p, uint64_t count) {
    return w == 1 ? FirstAtLeast(p, count, vocab)
                  : FirstAtLeast(reinterpret_cast<const uint16_t*>(p), count, vocab);
  };
  const uint64_t total = tokens();
  if (!buffer_->mapped()) {
    // In memory (synthetic, tests): copied nowhere, scanned in place (tokens are bytes here).
    if (const uint64_t i = first(token_data(), total); i != kNotFound) return refuse(i);
  } else {
    const int fd = buffer_->fd();
    ::posix_fadvise(fd, static_cast<off_t>(data_offset_), static_cast<off_t>(total * w),
                    POSIX_FADV_SEQUENTIAL);
    const uint64_t per_chunk = std::min(kScanChunkBytes / w, total);
    // uint16-aligned for the 2-byte formats; not zeroed (pread fills what is scanned).
    std::unique_ptr<uint16_t[]> chunk(new uint16_t[(per_chunk * w + 1) / 2]);
    auto* bytes = reinterpret_cast<unsigned char*>(chunk.get());
    for (uint64_t begin = 0; begin < total; begin += per_chunk) {
      const uint64_t count = std::min(per_chunk, total - begin);
      ZINF_RETURN_IF_ERROR(PreadAll(fd, bytes, count * w, data_offset_ + begin * w, source_.path));
      if (const uint64_t i = first(bytes, count); i != kNotFound) return refuse(begin + i);
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace zinf::train
