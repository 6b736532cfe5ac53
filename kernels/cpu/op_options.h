// kernels/cpu/op_options.h — the options every CPU op of kernels/cpu takes (the layer ops and
// the fixed-order reductions of grad_ops.h).
//
// Thread-safety: a plain value.
#pragma once

namespace zinf::kernels::cpu {

struct OpOptions {
  int threads = 0;  // oneTBB workers; 0 = every core
};

}  // namespace zinf::kernels::cpu
