// src/train/token_file.h — the token files `zinf train --data` reads, and their fingerprint.
//
// Contract:
// - Formats (DataFormat):
//     text     the file's bytes are the tokens (values 0..255), no header.
//     nanogpt  nanoGPT's prepare.py output (train.bin, val.bin): little-endian uint16 tokens, no
//              header. An odd byte count is refused (truncated, or not uint16 tokens).
//     llmc     llm.c's GPT-2 token files: a header of 256 little-endian int32, header[0] the magic
//              20240520, header[1] the version, header[2] the token count N; then N uint16
//              tokens. Version 1 only (what llm.c's dataloader accepts; it writes uint32 LLaMA 3
//              tokens under another magic, 20240801, which is refused by name). A file shorter
//              than the header, a count <= 0 or a size other than 1024 + 2N bytes is refused,
//              naming the size and the count.
//     auto     resolved per file by TokenFile::Open: llmc when the first 4 bytes are llm.c's GPT-2
//              magic; a refusal when they are the magic of llm.c's LLaMA 3 tokens (20240801) or
//              of its eval files (20240522), naming it (choose nanogpt or text explicitly to read
//              such a file anyway); else nanogpt when the name ends in ".bin"; else text. A .bin
//              file holding text is not told apart from tokens: name the format for it. An
//              explicit nanogpt on a file starting with llm.c's magic reads it as asked and warns.
// - TokenFile::Open checks the layout above and maps the file read-only (PROT_READ,
//   MAP_PRIVATE): tokens are read from the mapping, never copied into memory, so a 9 GB
//   train.bin costs only the pages a run touches (clean page cache, reclaimable). The file must
//   not be modified or truncated while it is open (a read of a truncated page is SIGBUS).
//   CheckVocab reads the file once, front to back, with pread into a small buffer (so the scan
//   leaves nothing mapped and resident, and an I/O error is a Status), refusing the first token
//   >= vocab by naming the file, the token's byte offset in the file and its value.
// - DataSource describes a file for a resume: the format, the path as given, the token count, the
//   file's size in bytes, and the xxHash64 (seed 0) of its first min(size, 1 MiB) bytes and of its
//   last min(size, 1 MiB) bytes (header included: `head -c 1048576 FILE | xxhsum -H64` prints
//   the first). CheckSameAs compares everything but the path (a file may move).
//
// Thread-safety: a TokenFile and its TokenBuffer are immutable once opened; copies share the
// mapping and may be read from any thread. CheckVocab may run concurrently with readers.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "zinf/status.h"

namespace zinf::train {

enum class DataFormat { kAuto, kText, kNanoGpt, kLlmc };
std::string_view DataFormatName(DataFormat format);  // "auto", "text", "nanogpt", "llmc"
// One of the names above; anything else is refused, naming it and the four accepted.
Result<DataFormat> ParseDataFormat(std::string_view name);

inline constexpr int32_t kLlmcMagic = 20240520;        // llm.c's GPT-2 token files
inline constexpr int32_t kLlmcVersion = 1;             // uint16 tokens
inline constexpr int32_t kLlmcLlama3Magic = 20240801;  // llm.c's LLaMA 3 tokens (uint32)
inline constexpr int32_t kLlmcEvalMagic = 20240522;    // llm.c's multiple-choice eval files
inline constexpr uint64_t kLlmcHeaderBytes = 256 * 4;
inline constexpr uint64_t kFingerprintBytes = 1 << 20;  // hashed at each end of a file

struct DataSource {
  DataFormat format = DataFormat::kText;  // resolved: never kAuto
  std::string path;                       // as given; a synthetic corpus's name
  uint64_t tokens = 0;
  uint64_t file_bytes = 0;  // header included
  uint64_t head_xxh64 = 0, tail_xxh64 = 0;

  // "nanogpt train.bin: 4000 tokens, 8000 bytes, xxh64 head 0123456789abcdef tail ..."
  std::string ToString() const;
  // FailedPrecondition naming each field (but the path) that differs from `recorded`.
  Status CheckSameAs(const DataSource& recorded) const;
  // The fingerprint of `bytes` as the contract above spells it (format, path, tokens unset).
  static DataSource Fingerprint(std::string_view bytes);
};

// Token `index` of little-endian tokens of `token_bytes` (1 or 2) bytes each starting at `tokens`.
inline int32_t LoadToken(const unsigned char* tokens, uint32_t token_bytes, uint64_t index) {
  if (token_bytes == 1) return tokens[index];
  uint16_t v;
  std::memcpy(&v, tokens + 2 * index, 2);
  return v;
}

// Read-only bytes shared by a corpus and its samplers: a mapped file or an owned string.
class TokenBuffer {
 public:
  static std::shared_ptr<const TokenBuffer> Own(std::string bytes);
  ~TokenBuffer();
  TokenBuffer(const TokenBuffer&) = delete;
  TokenBuffer& operator=(const TokenBuffer&) = delete;

  const unsigned char* data() const { return data_; }
  uint64_t size() const { return size_; }
  bool mapped() const { return map_ != nullptr; }
  int fd() const { return fd_; }  // the mapped file, open while the buffer lives; -1 if owned

 private:
  friend class TokenFile;
  TokenBuffer() = default;

  const unsigned char* data_ = nullptr;
  uint64_t size_ = 0;
  std::string owned_;
  void* map_ = nullptr;
  int fd_ = -1;
};

class TokenFile {
 public:
  // Opens `path` as `format` (kAuto resolves as above), checks its layout and maps it.
  static Result<TokenFile> Open(const std::string& path, DataFormat format);
  // Tokens given in memory (`source` names them): the synthetic corpus, tests. Text format.
  static TokenFile FromBytes(std::string source, std::string bytes);

  // Refuses a token >= vocab (see above). Returns the seconds the scan took (0 when every
  // value of the format is below vocab, which needs no scan).
  Result<double> CheckVocab(uint32_t vocab) const;

  const DataSource& source() const { return source_; }
  DataFormat format() const { return source_.format; }
  uint64_t tokens() const { return source_.tokens; }
  uint32_t token_bytes() const { return token_bytes_; }  // 1 (text) or 2
  uint64_t data_offset() const { return data_offset_; }  // the first token's byte offset
  // The buffer, and where its tokens start (data_offset bytes in).
  const std::shared_ptr<const TokenBuffer>& buffer() const { return buffer_; }
  const unsigned char* token_data() const { return buffer_->data() + data_offset_; }

 private:
  TokenFile() = default;

  DataSource source_;
  std::shared_ptr<const TokenBuffer> buffer_;
  uint64_t data_offset_ = 0;
  uint32_t token_bytes_ = 1;
};

}  // namespace zinf::train
