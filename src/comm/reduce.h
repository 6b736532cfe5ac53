// src/comm/reduce.h — the element arithmetic of the rank-ordered reductions.
//
// Contract: ReducePair(send, recv) says whether a reduction from send_type into recv_type is
// supported (communicator.h lists the pairs). SumInOrder sums in the destination type, element
// by element, in rank order: the same bits whatever the caller's chunking (NaN payloads aside:
// which of two NaNs an addition returns may vary). Widening bf16 and fp16 to fp32 is exact
// (kernels/cpu/half_convert.h's conversions).
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>

#include "src/comm/communicator.h"

namespace zinf::comm {

bool ReducePair(DType send, DType recv);
// dst = ((0 + srcs[0]) + srcs[1]) + ... + srcs[count-1], element by element, a cache line of
// dst at a time (one pass over the memory), each line's sums kept aside until every source of
// it is read and then stored. So a source may overlap dst when it starts (dst_bytes -
// src_bytes) * n bytes or more after dst's start: exactly dst (same types: an in-place sum), or
// the back of dst (a 16-bit source in the last 2n bytes of an fp32 dst); no store reaches
// source bytes not yet read.
void SumInOrder(DType src_type, const void* const* srcs, size_t count, DType dst_type, void* dst,
                size_t n);

}  // namespace zinf::comm
