// kernels/cpu/op_helpers.h — the parallel splits and fixed-order sums the CPU model ops share
// (layer_ops.cc, llama_ops.cc). Internal to kernels/cpu: not an API.
//
// Contract. Every split depends on the shapes only, never on the thread count, and every sum
// adds in one fixed order, so an op built on these gives the same bits for any thread count:
// - ForRows: chunks of whole rows (about kRowChunkElems elements a task), each row done by one
//   task;
// - ForChunks: fixed chunks of `chunk` items (channels for sums over rows, elements for
//   elementwise ops, one (batch, head) pair for attention);
// - Sum, Dot: kLanes independent partial sums combined in a fixed order, so the compiler can
//   vectorize them without -ffast-math.
//
// Thread-safety: the helpers run fn on the oneTBB arena of OpOptions::threads workers; fn must
// write disjoint outputs per chunk.
#pragma once

#include <algorithm>
#include <cstddef>

#include "kernels/cpu/op_options.h"
#include "kernels/cpu/parallel.h"

namespace zinf::kernels::cpu::detail {

inline constexpr int kLanes = 8;
inline constexpr size_t kRowChunkElems = 8192;  // a row task covers about this many elements
inline constexpr size_t kElemChunk = 16384;     // elementwise ops
inline constexpr size_t kChannelChunk = 64;     // channel-split sums over rows: 256 B of fp32

// Runs fn(begin, end) over chunks of `rows` rows of `row_elems` elements each.
template <typename F>
void ForRows(size_t rows, size_t row_elems, const OpOptions& o, const F& fn) {
  const size_t per = std::max<size_t>(1, kRowChunkElems / std::max<size_t>(1, row_elems));
  ParallelForChunks(rows, {.threads = o.threads, .chunk_elems = per},
                    [&](size_t begin, size_t end) { fn(begin, end); });
}

// Runs fn(begin, end) over chunks of `chunk` of the n items.
template <typename F>
void ForChunks(size_t n, size_t chunk, const OpOptions& o, const F& fn) {
  ParallelForChunks(n, {.threads = o.threads, .chunk_elems = chunk},
                    [&](size_t begin, size_t end) { fn(begin, end); });
}

template <typename T>
T CombineLanes(const T (&acc)[kLanes]) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Σ x[i], in a fixed order.
template <typename T>
T Sum(const T* x, int n) {
  T acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += x[i];
  return CombineLanes(acc);
}

// Σ a[i] * b[i], in a fixed order.
template <typename T>
T Dot(const T* a, const T* b, int n) {
  T acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  for (int j = 0; i < n; ++i, ++j) acc[j] += a[i] * b[i];
  return CombineLanes(acc);
}

}  // namespace zinf::kernels::cpu::detail
