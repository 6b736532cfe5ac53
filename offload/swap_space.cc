#include "offload/swap_space.h"

#include <fmt/format.h>

namespace zinf::offload {

Result<std::unique_ptr<SwapSpace>> SwapSpace::Create(io::Engine& engine,
                                                     const io::SwapFileOptions& options) {
  auto s = std::unique_ptr<SwapSpace>(new SwapSpace(engine));
  ZINF_ASSIGN_OR_RETURN(s->swap_, io::SwapFile::Create(options));
  ZINF_ASSIGN_OR_RETURN(s->file_, engine.AddFile(s->swap_->Layout()));
  return s;
}

uint64_t SwapSpace::Padded(uint64_t bytes) const {
  const uint64_t a = swap_->offset_align();
  return (bytes + a - 1) / a * a;
}

Result<Extent> SwapSpace::Allocate(uint64_t bytes) {
  if (bytes == 0) return InvalidArgument("swap space: extent of 0 bytes");
  const uint64_t stripe = swap_->stripe_bytes();
  const uint64_t align = (stripe != 0 && bytes >= stripe) ? stripe : swap_->offset_align();
  std::lock_guard lock(mu_);
  uint64_t off = (next_ + align - 1) / align * align;
  uint64_t end = off + Padded(bytes);
  if (end > swap_->size()) {
    return ResourceExhausted(fmt::format(
        "swap space {}: no room for {} more bytes (capacity {}, allocated {}); make the swap "
        "file larger", swap_->members()[0]->path(), bytes, swap_->size(), next_));
  }
  next_ = end;
  return Extent{off, bytes};
}

uint64_t SwapSpace::allocated() const {
  std::lock_guard lock(mu_);
  return next_;
}

}  // namespace zinf::offload
