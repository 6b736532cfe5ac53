#include "tools/io_bench_target.h"

#include <sys/file.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include "io/extents.h"
#include "src/base/log.h"
#include "src/base/units.h"
#include "tools/io_bench.h"

namespace zinf::tools {
namespace {

namespace fs = std::filesystem;

// What the refusal of a file that is not all written data says, after the range.
constexpr const char* kWhyUnbacked =
    "reads of it would return zeros without touching the disk, so the read numbers would "
    "measure memory, not the disk";

// Refuses `file` unless [0, bytes) of it is written data on the disk.
Status RequireWrittenData(const io::File& file, uint64_t bytes, std::string_view remedy) {
  ZINF_ASSIGN_OR_RETURN(io::BackingReport r, io::CheckBacking(file.fd(), file.path(), bytes));
  if (!r.fiemap_supported) {
    WarnOnce("bench.fiemap." + file.path(),
             fmt::format("bench-io: the file system of {} does not support FIEMAP ({}): "
                         "unwritten extents cannot be detected there; only holes (SEEK_HOLE) "
                         "were checked", file.path(), r.fiemap_error));
  }
  if (!r.first) return Status::Ok();
  const io::UnbackedRange& u = *r.first;
  const std::string what = u.kind == "end of file"        ? "past its end"
                           : u.kind == "unwritten extent" ? "an unwritten extent (allocated by "
                                                            "fallocate, never written)"
                                                          : "a " + u.kind;
  return FailedPrecondition(fmt::format(
      "{} is not all written data: bytes [{}, {}) are {}, {} of the {} to read in all; {}. {}",
      file.path(), u.begin, u.end, what, FormatBytesHuman(r.unbacked_bytes),
      FormatBytesHuman(bytes), kWhyUnbacked, remedy));
}

Status LockExclusive(const io::File& f) {
  if (::flock(f.fd(), LOCK_EX | LOCK_NB) == 0) return Status::Ok();
  const int e = errno;
  return e == EWOULDBLOCK
             ? FailedPrecondition(fmt::format("{} is in use by another process", f.path()))
             : Status::FromErrno(e, "lock " + f.path());
}

// How many bytes of member `m` the logical range [0, size) uses (FileLayout's striping).
uint64_t MemberBytes(uint64_t size, uint64_t stripe, size_t n, size_t m) {
  if (n == 1) return size;
  uint64_t need = 0;
  for (uint64_t k = m, start = m * stripe; start < size; k += n, start += n * stripe) {
    need = (k / n) * stripe + std::min(stripe, size - start);
  }
  return need;
}

}  // namespace

std::string_view IoBenchTarget::KindName() const {
  switch (kind_) {
    case Kind::kNewFile: return "new test file";
    case Kind::kKeptFile: return "kept test file, read as it is";
    case Kind::kReadOnlyFile: return "existing file, read-only";
    case Kind::kBlockDevice: return "block device, read-only";
  }
  return "?";
}

Result<std::unique_ptr<IoBenchTarget>> IoBenchTarget::Create(const std::vector<std::string>& dirs,
                                                             uint64_t size,
                                                             uint64_t stripe_bytes, bool keep) {
  auto t = std::unique_ptr<IoBenchTarget>(new IoBenchTarget());
  ZINF_ASSIGN_OR_RETURN(t->swap_, io::SwapFile::Create({.dirs = dirs,
                                                         .name = kIoBenchFileName,
                                                         .size = size,
                                                         .stripe_bytes = stripe_bytes,
                                                         .remove_on_close = !keep}));
  t->layout_ = t->swap_->Layout();
  t->direct_ = t->swap_->direct();
  t->kind_ = Kind::kNewFile;
  return t;
}

Result<std::unique_ptr<IoBenchTarget>> IoBenchTarget::OpenKept(
    const std::vector<std::string>& dirs, uint64_t size, uint64_t stripe_bytes) {
  if (dirs.empty()) return InvalidArgument("--no-fill: no directory given");
  if (size == 0) return InvalidArgument("--no-fill: --size must be > 0");
  const size_t n = dirs.size();
  if (n > 1 && stripe_bytes == 0) return InvalidArgument("--stripe must be > 0 when striping");
  auto t = std::unique_ptr<IoBenchTarget>(new IoBenchTarget());
  t->kind_ = Kind::kKeptFile;
  t->filled_ = true;
  uint32_t offset_align = 1, mem_align = 1;
  for (size_t i = 0; i < n; ++i) {
    const std::string path = (fs::path(dirs[i]) / (n > 1 ? fmt::format("{}.{}", kIoBenchFileName, i)
                                                        : std::string(kIoBenchFileName)))
                                 .string();
    auto f = io::File::Open(path, {.direct = true, .only_own = true});
    if (!f.ok()) {
      if (f.status().code() == StatusCode::kNotFound) {
        return FailedPrecondition(fmt::format(
            "--no-fill: {} does not exist; run once with --keep and without --no-fill to create "
            "and fill it", path));
      }
      return f.status().WithContext("--no-fill");
    }
    ZINF_RETURN_IF_ERROR(LockExclusive(**f));
    offset_align = std::max(offset_align, (*f)->alignment().offset);
    mem_align = std::max(mem_align, (*f)->alignment().mem);
    t->direct_ = t->direct_ && (*f)->direct();
    t->files_.push_back(std::move(f).value());
  }
  const uint64_t logical = (size + offset_align - 1) / offset_align * offset_align;
  if (n > 1 && stripe_bytes % offset_align != 0) {
    return InvalidArgument(fmt::format("--stripe {} is not a multiple of the O_DIRECT alignment "
                                       "{} of {}", stripe_bytes, offset_align,
                                       t->files_[0]->path()));
  }
  for (size_t m = 0; m < n; ++m) {
    const io::File& f = *t->files_[m];
    const uint64_t need = MemberBytes(logical, stripe_bytes, n, m);
    ZINF_ASSIGN_OR_RETURN(uint64_t have, f.Size());
    if (have < need) {
      return FailedPrecondition(fmt::format(
          "--no-fill: {} holds {} bytes but --size {} needs {} of it; pass a --size that fits "
          "or run without --no-fill to make and fill a file of that size",
          f.path(), have, size, need));
    }
    ZINF_RETURN_IF_ERROR(RequireWrittenData(
        f, need, "Run once without --no-fill (it fills the file before reading) or write the "
                 "whole file first").WithContext("--no-fill"));
    t->layout_.members.push_back(io::FileMember{f.fd(), f.path()});
  }
  t->layout_.stripe_bytes = n > 1 ? stripe_bytes : 0;
  t->layout_.size = logical;
  t->layout_.offset_align = offset_align;
  t->layout_.mem_align = mem_align;
  return t;
}

Result<std::unique_ptr<IoBenchTarget>> IoBenchTarget::OpenReadOnly(const std::string& path,
                                                                   uint64_t size) {
  std::error_code ec;
  const std::string real = fs::canonical(path, ec).string();
  if (ec) return Status::FromErrno(ec.value(), "resolve --path " + path);
  auto f = io::File::Open(real, {.direct = true, .read_only = true, .allow_block_device = true});
  if (!f.ok()) return f.status();
  auto t = std::unique_ptr<IoBenchTarget>(new IoBenchTarget());
  t->filled_ = true;
  t->direct_ = (*f)->direct();
  std::error_code type_ec;
  t->kind_ = fs::is_block_file(real, type_ec) ? Kind::kBlockDevice : Kind::kReadOnlyFile;
  const uint32_t align = (*f)->alignment().offset;
  ZINF_ASSIGN_OR_RETURN(uint64_t have, (*f)->Size());
  if (size > have) {
    return FailedPrecondition(fmt::format("{} holds {} bytes, less than --size {}", real, have,
                                          size));
  }
  const uint64_t bytes = (size == 0 ? have : size) / align * align;
  if (bytes == 0) {
    return FailedPrecondition(fmt::format("{} holds {} bytes: nothing to read in units of its "
                                          "O_DIRECT alignment {}", real, have, align));
  }
  if (t->kind_ == Kind::kReadOnlyFile) {
    ZINF_RETURN_IF_ERROR(RequireWrittenData(
        **f, bytes, "Pass a --size that covers only written data, or write the file fully"));
  }
  t->layout_.members.push_back(io::FileMember{(*f)->fd(), real});
  t->layout_.size = bytes;
  t->layout_.offset_align = align;
  t->layout_.mem_align = (*f)->alignment().mem;
  t->files_.push_back(std::move(f).value());
  return t;
}

Status IoBenchTarget::EnsureFilled() {
  if (filled_) return Status::Ok();
  IoBenchSpec fill;
  fill.pattern = IoPattern::kWrite;
  // Blocks that tile the whole file (a run moves whole blocks only): up to 1 MiB.
  const uint64_t align = std::max<uint64_t>(offset_align(), 1);
  uint64_t block = std::min<uint64_t>(1 << 20, size()) / align * align;
  while (block > align && size() % block != 0) block -= align;
  fill.block = block;
  fill.queue_depth = 16;
  fill.seconds = 0;
  fill.bytes_limit = size();
  filled_ = true;  // RunIoBench below must not recurse into filling
  auto r = RunIoBench(*this, fill);
  if (!r.ok()) {
    filled_ = false;
    return r.status().WithContext("filling the benchmark file before reads");
  }
  return Status::Ok();
}

}  // namespace zinf::tools
