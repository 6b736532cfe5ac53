#include "src/train/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <utility>

#include "src/base/atomic_file.h"
#include "src/base/json_strict.h"

namespace zinf::train {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; big-endian hosts are not supported");

using nlohmann::json;
using nlohmann::ordered_json;

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // the reference reader's MAX_HEADER_SIZE
constexpr std::string_view kMetadataKey = "__metadata__";

struct DtypeEntry {
  Dtype dtype;
  std::string_view name;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {Dtype::kBool, "BOOL", 1},      {Dtype::kU8, "U8", 1},          {Dtype::kI8, "I8", 1},
    {Dtype::kF8E5M2, "F8_E5M2", 1}, {Dtype::kF8E4M3, "F8_E4M3", 1}, {Dtype::kI16, "I16", 2},
    {Dtype::kU16, "U16", 2},        {Dtype::kF16, "F16", 2},        {Dtype::kBF16, "BF16", 2},
    {Dtype::kI32, "I32", 4},        {Dtype::kU32, "U32", 4},        {Dtype::kF32, "F32", 4},
    {Dtype::kF64, "F64", 8},        {Dtype::kI64, "I64", 8},        {Dtype::kU64, "U64", 8},
};

std::string Quoted(std::string_view s) {
  try {
    return json(std::string(s)).dump();
  } catch (const json::exception&) {  // not UTF-8: show it as it is
    return fmt::format("\"{}\"", s);
  }
}

std::string ShapeText(const std::vector<uint64_t>& shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

// The byte size of a tensor, or false on 64-bit overflow.
bool ByteSize(Dtype dtype, const std::vector<uint64_t>& shape, uint64_t* bytes) {
  uint64_t n = DtypeSize(dtype);
  for (uint64_t d : shape) {
    if (__builtin_mul_overflow(n, d, &n)) return false;
  }
  *bytes = n;
  return true;
}

// Reads one tensor entry of the header.
Result<SafetensorsTensor> ParseEntry(const std::string& path, const std::string& name,
                                     const json& entry) {
  auto bad = [&](std::string what) {
    return InvalidArgument(
        fmt::format("safetensors file {}: tensor {}: {}", path, Quoted(name), what));
  };
  if (!entry.is_object()) {
    return bad(fmt::format("entry is {}; expected an object with dtype, shape, data_offsets",
                           entry.dump()));
  }
  SafetensorsTensor t;
  t.name = name;
  auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) {
    return bad(
        "\"dtype\" is missing or not a string; expected one of BOOL, U8, I8, F8_E5M2, "
        "F8_E4M3, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64");
  }
  auto parsed = ParseDtype(dtype->get<std::string>());
  if (!parsed.ok()) return bad(parsed.status().message());
  t.dtype = *parsed;
  auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) {
    return bad("\"shape\" is missing or not an array; expected an array of integers >= 0");
  }
  for (const json& d : *shape) {
    if (!d.is_number_unsigned()) {
      return bad(fmt::format("shape {} holds {}; expected integers >= 0", shape->dump(), d.dump()));
    }
    t.shape.push_back(d.get<uint64_t>());
  }
  auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return bad(fmt::format("data_offsets is {}; expected [begin, end], integers >= 0",
                           offsets == entry.end() ? "missing" : offsets->dump()));
  }
  t.begin = (*offsets)[0].get<uint64_t>();
  t.end = (*offsets)[1].get<uint64_t>();
  if (t.end < t.begin) {
    return bad(fmt::format("data_offsets [{}, {}] end before begin", t.begin, t.end));
  }
  uint64_t bytes = 0;
  if (!ByteSize(t.dtype, t.shape, &bytes)) {
    return bad(
        fmt::format("shape {} × {} overflows 64 bits", ShapeText(t.shape), DtypeName(t.dtype)));
  }
  if (bytes != t.bytes()) {
    return bad(
        fmt::format("shape {} × {} ({} bytes each) is {} bytes but data_offsets [{}, {}] "
                    "span {}",
                    ShapeText(t.shape), DtypeName(t.dtype), DtypeSize(t.dtype), bytes, t.begin,
                    t.end, t.bytes()));
  }
  return t;
}

}  // namespace

std::string_view DtypeName(Dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

size_t DtypeSize(Dtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.size;
  }
  return 0;
}

Result<Dtype> ParseDtype(std::string_view name) {
  for (const auto& e : kDtypes) {
    if (e.name == name) return e.dtype;
  }
  return InvalidArgument(fmt::format(
      "dtype {} is unknown; expected one of BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, U16, F16, "
      "BF16, I32, U32, F32, F64, I64, U64",
      Quoted(name)));
}

uint64_t SafetensorsTensor::elements() const {
  uint64_t n = 1;
  for (uint64_t d : shape) n *= d;
  return n;
}

// ---- writing ----------------------------------------------------------------------------------

Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                        const SafetensorsMetadata& metadata) {
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("write safetensors {}: {}", path, what));
  };
  std::set<std::string_view> names;
  std::vector<uint64_t> sizes(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorToWrite& t = tensors[i];
    if (t.name.empty()) return bad(fmt::format("tensor {} has an empty name", i));
    if (t.name == kMetadataKey) return bad("a tensor may not be named \"__metadata__\"");
    if (!names.insert(t.name).second)
      return bad(fmt::format("tensor {} given twice", Quoted(t.name)));
    if (DtypeSize(t.dtype) == 0)
      return bad(fmt::format("tensor {}: dtype unknown", Quoted(t.name)));
    if (!ByteSize(t.dtype, t.shape, &sizes[i])) {
      return bad(fmt::format("tensor {}: shape {} × {} overflows 64 bits", Quoted(t.name),
                             ShapeText(t.shape), DtypeName(t.dtype)));
    }
    if (sizes[i] > 0 && t.data == nullptr && !t.fill) {
      return bad(fmt::format("tensor {}: data is null for {} bytes", Quoted(t.name), sizes[i]));
    }
  }
  // The reference writer's layout: widest dtype first, then by name.
  std::vector<size_t> order(tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tensors[a].dtype != tensors[b].dtype) return tensors[a].dtype > tensors[b].dtype;
    return tensors[a].name < tensors[b].name;
  });

  ordered_json header = ordered_json::object();
  if (!metadata.empty()) {
    ordered_json m = ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;  // std::map: keys sorted
    header[std::string(kMetadataKey)] = std::move(m);
  }
  uint64_t offset = 0;
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    ordered_json e = ordered_json::object();
    e["dtype"] = std::string(DtypeName(t.dtype));
    e["shape"] = t.shape;
    e["data_offsets"] = {offset, offset + sizes[i]};
    header[t.name] = std::move(e);
    offset += sizes[i];
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const ordered_json::exception& e) {
    return bad(fmt::format("a tensor name or metadata string is not valid UTF-8 ({})", e.what()));
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char length[8];
  uint64_t n = text.size();
  std::memcpy(length, &n, 8);

  ZINF_ASSIGN_OR_RETURN(AtomicFile out, AtomicFile::Create(path));
  ZINF_RETURN_IF_ERROR(out.Append(length, 8));
  ZINF_RETURN_IF_ERROR(out.Append(text.data(), text.size()));
  std::vector<unsigned char> buffer;
  for (size_t i : order) {
    const TensorToWrite& t = tensors[i];
    if (t.data != nullptr || sizes[i] == 0) {
      ZINF_RETURN_IF_ERROR(out.Append(t.data, sizes[i]));
      continue;
    }
    buffer.resize(static_cast<size_t>(std::min<uint64_t>(kSafetensorsFillBytes, sizes[i])));
    for (uint64_t at = 0; at < sizes[i];) {
      const uint64_t n = std::min<uint64_t>(buffer.size(), sizes[i] - at);
      ZINF_RETURN_IF_ERROR(t.fill(buffer.data(), at, n)
                               .WithContext(fmt::format("write safetensors {}: tensor {}", path,
                                                        Quoted(t.name))));
      ZINF_RETURN_IF_ERROR(out.Append(buffer.data(), n));
      at += n;
    }
  }
  return out.Commit();
}

// ---- reading ----------------------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept { *this = std::move(other); }

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    header_bytes_ = other.header_bytes_;
    tensors_ = std::move(other.tensors_);
    index_ = std::move(other.index_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Status SafetensorsFile::Read(std::string_view name, void* dst, size_t bytes) const {
  const SafetensorsTensor* t = Find(name);
  if (t == nullptr) {
    return NotFound(fmt::format("safetensors file {}: no tensor {}", path_, Quoted(name)));
  }
  if (bytes != t->bytes()) {
    return InvalidArgument(fmt::format(
        "safetensors file {}: tensor {} ({} {}) is {} bytes; the destination holds {}", path_,
        Quoted(name), DtypeName(t->dtype), ShapeText(t->shape), t->bytes(), bytes));
  }
  return PreadAll(fd_, dst, bytes, data_offset() + t->begin, path_);
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  SafetensorsFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd_ < 0) return Status::FromErrno(errno, "open safetensors file " + path);
  struct stat st;
  if (::fstat(f.fd_, &st) != 0) return Status::FromErrno(errno, "fstat " + path);
  const uint64_t file_bytes = static_cast<uint64_t>(st.st_size);
  auto bad = [&](std::string what) {
    return InvalidArgument(fmt::format("safetensors file {}: {}", path, what));
  };
  if (file_bytes < 8) {
    return DataLoss(
        fmt::format("safetensors file {}: {} bytes; expected at least the 8-byte "
                    "header length",
                    path, file_bytes));
  }
  unsigned char length[8];
  ZINF_RETURN_IF_ERROR(PreadAll(f.fd_, length, 8, 0, path));
  uint64_t n = 0;
  std::memcpy(&n, length, 8);
  if (n > kMaxHeaderBytes) {
    return bad(fmt::format("header length {} exceeds the limit of {} bytes", n, kMaxHeaderBytes));
  }
  if (n > file_bytes - 8) {
    return DataLoss(
        fmt::format("safetensors file {}: header length {} runs past the end of "
                    "the file ({} bytes)",
                    path, n, file_bytes));
  }
  f.header_bytes_ = n;
  std::string text(n, '\0');
  ZINF_RETURN_IF_ERROR(PreadAll(f.fd_, text.data(), n, 8, path));
  json header;
  try {
    header = ParseJsonRefusingDuplicates(text);
  } catch (const DuplicateJsonKey& d) {
    const std::string& key = d.path.back();
    const std::string where =
        d.path.size() >= 2 ? fmt::format("key {} of entry {}", Quoted(key), Quoted(d.path[d.path.size() - 2]))
                           : fmt::format("top-level key {}", Quoted(key));
    return bad(fmt::format("header gives {} twice", where));
  } catch (const json::exception& e) {
    return bad(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) {
    return bad(fmt::format("header is {}; expected a JSON object", header.type_name()));
  }
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (value.is_null()) continue;
      if (!value.is_object()) {
        return bad(fmt::format("__metadata__ is {}; expected an object of strings", value.dump()));
      }
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) {
          return bad(
              fmt::format("__metadata__ key {} is {}; expected a string", Quoted(mk), mv.dump()));
        }
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    ZINF_ASSIGN_OR_RETURN(SafetensorsTensor t, ParseEntry(path, key, value));
    f.tensors_.push_back(std::move(t));
  }
  // Layout: sorted by offset, the ranges tile the buffer exactly (the reference's rule).
  const uint64_t buffer_bytes = file_bytes - 8 - n;
  std::sort(f.tensors_.begin(), f.tensors_.end(), [](const auto& a, const auto& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  uint64_t covered = 0;
  const SafetensorsTensor* previous = nullptr;
  for (const SafetensorsTensor& t : f.tensors_) {
    if (t.end > buffer_bytes) {
      return bad(
          fmt::format("tensor {}: data_offsets [{}, {}] run past the byte buffer of {} "
                      "bytes (file {} bytes, header {})",
                      Quoted(t.name), t.begin, t.end, buffer_bytes, file_bytes, n));
    }
    if (t.begin < covered) {
      return bad(fmt::format("tensor {}: data_offsets [{}, {}] overlap tensor {} [{}, {}]",
                             Quoted(t.name), t.begin, t.end, Quoted(previous->name),
                             previous->begin, previous->end));
    }
    if (t.begin > covered) {
      return bad(
          fmt::format("tensor {}: data_offsets [{}, {}] leave bytes [{}, {}) of the "
                      "buffer to no tensor",
                      Quoted(t.name), t.begin, t.end, covered, t.begin));
    }
    covered = t.end;
    previous = &t;
  }
  if (covered != buffer_bytes) {
    return bad(
        fmt::format("bytes [{}, {}) of the byte buffer belong to no tensor (the file has "
                    "{} bytes after its header, the tensors cover {})",
                    covered, buffer_bytes, buffer_bytes, covered));
  }
  for (size_t i = 0; i < f.tensors_.size(); ++i) f.index_.emplace(f.tensors_[i].name, i);
  return f;
}

}  // namespace zinf::train
