// src/train/unit_layout.h — what the model families (gpt.h, llama.h) share to lay out a unit:
// its tensors' names, shapes and offsets in the unit's one array, the carving of that array (or
// of an activation buffer) into pointers, and the counter-based draws of the weight inits.
//
// Contract: TensorListBuilder::Add appends a tensor at the next offset; Carver::Take hands out
// consecutive runs of a buffer. InitNormal(UnitKey(seed, unit), i) is a standard normal that
// depends on (seed, unit, i) only (SplitMix64 mixing and Box-Muller on two 53-bit uniforms), so
// an init is the same for any thread count, chunking or platform <random>.
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <utility>
#include <vector>

namespace zinf::train {

struct TensorInfo {
  std::string name;            // the checkpoint's name (nanoGPT's for GPT-2, HF's for Llama)
  std::vector<int64_t> shape;  // row-major
  uint64_t offset = 0;         // elements from the start of the unit's array
  uint64_t elems = 0;
};

class TensorListBuilder {
 public:
  void Add(std::string name, std::vector<int64_t> shape) {
    uint64_t n = 1;
    for (int64_t x : shape) n *= static_cast<uint64_t>(x);
    list_.push_back({std::move(name), std::move(shape), offset_, n});
    offset_ += n;
  }
  std::vector<TensorInfo> Take() { return std::move(list_); }

 private:
  std::vector<TensorInfo> list_;
  uint64_t offset_ = 0;
};

template <typename T>
class Carver {
 public:
  explicit Carver(T* base) : p_(base) {}
  T* Take(uint64_t n) {
    T* r = p_;
    p_ += n;
    return r;
  }
  T* next() const { return p_; }

 private:
  T* p_;
};

inline uint64_t InitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t UnitKey(uint64_t seed, uint32_t unit) {
  return InitMix(seed ^ InitMix(0x5eed0000ull + unit));
}

inline double InitNormal(uint64_t key, uint64_t i) {
  const uint64_t a = InitMix(key ^ InitMix(2 * i)), b = InitMix(key ^ InitMix(2 * i + 1));
  const double u1 = (static_cast<double>(a >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(b >> 11) * 0x1.0p-53;          // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

}  // namespace zinf::train
