#include "src/base/hash.h"

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <fmt/format.h>

namespace zinf {

struct Xxh64Stream::State {
  XXH64_state_t s;
};

uint64_t Xxh64(const void* data, size_t bytes) { return XXH64(data, bytes, 0); }

std::string Xxh64Hex(uint64_t hash) { return fmt::format("{:016x}", hash); }

std::optional<uint64_t> ParseXxh64Hex(std::string_view text) {
  if (text.size() != 16) return std::nullopt;
  uint64_t v = 0;
  for (char ch : text) {
    int d;
    if (ch >= '0' && ch <= '9') d = ch - '0';
    else if (ch >= 'a' && ch <= 'f') d = ch - 'a' + 10;
    else if (ch >= 'A' && ch <= 'F') d = ch - 'A' + 10;
    else return std::nullopt;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  return v;
}

Xxh64Stream::Xxh64Stream() : state_(std::make_unique<State>()) { XXH64_reset(&state_->s, 0); }
Xxh64Stream::~Xxh64Stream() = default;
void Xxh64Stream::Update(const void* data, size_t bytes) { XXH64_update(&state_->s, data, bytes); }
uint64_t Xxh64Stream::Digest() const { return XXH64_digest(&state_->s); }

}  // namespace zinf
