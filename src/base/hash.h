// src/base/hash.h — xxHash64 (Debian's libxxhash, header-only here), in one place.
//
// Contract: Xxh64(data, n) is XXH64 with seed 0, what checkpoints record for each shard (as 16
// lowercase hex digits: Xxh64Hex). Xxh64Stream hashes a byte sequence given in pieces and gives
// the same value as Xxh64 over their concatenation. ParseXxh64Hex accepts exactly 16 hex digits.
//
// Thread-safety: pure functions; a stream is used by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace zinf {

uint64_t Xxh64(const void* data, size_t bytes);
std::string Xxh64Hex(uint64_t hash);
std::optional<uint64_t> ParseXxh64Hex(std::string_view text);

class Xxh64Stream {
 public:
  Xxh64Stream();
  ~Xxh64Stream();
  Xxh64Stream(const Xxh64Stream&) = delete;
  Xxh64Stream& operator=(const Xxh64Stream&) = delete;
  void Update(const void* data, size_t bytes);
  uint64_t Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace zinf
