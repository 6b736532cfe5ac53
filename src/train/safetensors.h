// src/train/safetensors.h — the safetensors file format (Hugging Face), read and written.
//
// Format: 8 bytes N (little-endian u64), N bytes of UTF-8 JSON header, then the byte buffer.
// The header is an object {name: {"dtype": "F32", "shape": [2, 3], "data_offsets": [b, e]},
// "__metadata__": {string: string}}; offsets are relative to the start of the byte buffer,
// element data is little-endian and row-major.
//
// Contract:
// - WriteSafetensors lays the tensors out as the reference writer (huggingface/safetensors
//   `prepare`) does: sorted by dtype, widest alignment first (the reference's dtype order),
//   then by name, packed without gaps, the header padded with spaces to a multiple of 8 so
//   every tensor's data is aligned to its element size. The order given does not matter; the
//   output for the same tensors is the same bytes. `__metadata__` is written (keys sorted)
//   only when not empty. The file is written to a new temporary file beside `path`
//   ("<path>.tmp.<pid>.<random>", created O_CREAT|O_EXCL|O_NOFOLLOW mode 0600: nothing already
//   there, a planted symlink included, is ever opened; another name on EEXIST), fsynced, given
//   mode 0666 & ~umask, renamed over `path` and the directory fsynced: a reader sees the old
//   file or the whole new one, never a part. On any failure the temporary file is removed.
//   Refused: an empty or duplicate name, the name "__metadata__", a null data pointer for a
//   non-empty tensor, a byte size that overflows 64 bits.
// - SafetensorsFile::Open accepts the tensors in any order in the header and validates
//   everything before returning, refusing what the reference reader refuses, each refusal
//   naming the file and the tensor or key: a file shorter than 8 bytes, a header length over
//   100,000,000 bytes or past the end of the file, a header that is not UTF-8 JSON or not an
//   object, a key given twice, a tensor entry that is not {dtype, shape, data_offsets} with a
//   known dtype, non-negative integer dims and two non-negative integer offsets begin <= end,
//   shape product × dtype size != end - begin (or overflowing), overlapping ranges, a gap
//   between ranges, a range past the end of the file, bytes after the last range, a
//   `__metadata__` that is not an object of strings. Unknown keys inside a tensor entry are
//   ignored, as the reference does.
// - Codes: DataLoss for a file shorter than its header says; NotFound for a missing file or
//   tensor; InvalidArgument for everything malformed; errno-mapped codes for I/O.
// - Only little-endian hosts are supported (static_assert).
//
// Thread-safety: WriteSafetensors may run on any thread; two writers of one path, in this
// process or another, each write their own temporary file (the last rename wins, each file
// whole). A SafetensorsFile is immutable after Open: Read may be called
// concurrently from several threads (pread on one descriptor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "zinf/status.h"

namespace zinf::train {

// The reference's dtypes, in the reference's order (increasing alignment).
enum class Dtype : uint8_t {
  kBool,
  kU8,
  kI8,
  kF8E5M2,
  kF8E4M3,
  kI16,
  kU16,
  kF16,
  kBF16,
  kI32,
  kU32,
  kF32,
  kF64,
  kI64,
  kU64,
};

std::string_view DtypeName(Dtype dtype);  // "BOOL", "U8", ..., "F8_E5M2", "BF16", "F32"
size_t DtypeSize(Dtype dtype);            // bytes per element: 1, 2, 4 or 8
// The dtype spelled `name` exactly as the format spells it ("F32"), or InvalidArgument.
Result<Dtype> ParseDtype(std::string_view name);

using SafetensorsMetadata = std::map<std::string, std::string>;

// One tensor to write: `data` holds DtypeSize(dtype) × product(shape) bytes (product of no
// dims is 1: a scalar); it may be null when that is 0. Or, with `data` null, `fill` streams
// them: called in order for consecutive pieces of at most kSafetensorsFillBytes, it writes
// `bytes` bytes of the tensor from byte `offset` into dst (a file is written tensor after
// tensor through one buffer of that size, whatever the tensors' size).
inline constexpr uint64_t kSafetensorsFillBytes = 8 << 20;
struct TensorToWrite {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  const void* data = nullptr;
  std::function<Status(void* dst, uint64_t offset, uint64_t bytes)> fill;
};

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const SafetensorsMetadata& metadata = {});

// One tensor of an opened file; `begin`/`end` are offsets in the byte buffer.
struct SafetensorsTensor {
  std::string name;
  Dtype dtype = Dtype::kF32;
  std::vector<uint64_t> shape;
  uint64_t begin = 0;
  uint64_t end = 0;

  uint64_t bytes() const { return end - begin; }
  uint64_t elements() const;  // product of shape
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  const std::string& path() const { return path_; }
  // Ordered by data offset (the file's layout), whatever the header's order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsMetadata& metadata() const { return metadata_; }
  uint64_t header_bytes() const { return header_bytes_; }     // N
  uint64_t data_offset() const { return 8 + header_bytes_; }  // file offset of the buffer
  // The tensor named `name`, or null.
  const SafetensorsTensor* Find(std::string_view name) const;

  // Copies the tensor's bytes into dst; `bytes` must equal its size (InvalidArgument names
  // both). NotFound for an unknown name; an I/O error or a short file names the offset.
  Status Read(std::string_view name, void* dst, size_t bytes) const;

 private:
  SafetensorsFile() = default;

  std::string path_;
  int fd_ = -1;
  uint64_t header_bytes_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::unordered_map<std::string, size_t> index_;  // name -> position in tensors_
  SafetensorsMetadata metadata_;
};

}  // namespace zinf::train
