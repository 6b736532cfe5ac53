// src/comm/reduce.h — the element arithmetic of the rank-ordered reductions.
//
// Contract: ReducePair(send, recv) says whether a reduction from send_type into recv_type is
// supported (communicator.h lists the pairs). Accumulate adds n widened values of `src` into
// `dst` (dst = 0 + src when first, else dst = dst + src), element by element in the destination
// type: the same bits whatever the caller's chunking. Widening bf16 and fp16 to fp32 is exact.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/comm/communicator.h"

namespace zinf::comm {

bool ReducePair(DType send, DType recv);
void Accumulate(DType src_type, const void* src, DType dst_type, void* dst, size_t n, bool first);
// dst = ((0 + srcs[0]) + srcs[1]) + ... + srcs[count-1], element by element: Accumulate over
// each source in turn, done in cache-sized blocks (one pass over dst), each block summed aside
// and then stored. So a source may overlap dst when it starts (dst_bytes - src_bytes) * n bytes
// or more after dst's start: exactly dst (same types: an in-place sum), or the back of dst (a
// 16-bit source in the last 2n bytes of an fp32 dst); no store reaches source bytes not yet read.
void SumInOrder(DType src_type, const void* const* srcs, size_t count, DType dst_type, void* dst,
                size_t n);
// fp16 bits to fp32, exactly (subnormals, infinities and NaNs included).
float HalfToFloat(uint16_t h);

}  // namespace zinf::comm
