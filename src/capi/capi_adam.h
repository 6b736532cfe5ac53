// src/capi/capi_adam.h — the zinf_adam handle of the C ABI (include/zinf/zinf.h), shared by
// zinf_adam_step (capi_adam.cc) and zinf_engine_adam_step (capi_engine.cc).
//
// Thread-safety: a handle holds only its hyperparameters; Step may run on several threads at
// once on disjoint buffers.
#pragma once

#include <cstdint>

#include "kernels/cpu/adam.h"
#include "zinf/status.h"

struct zinf_adam {
  zinf::kernels::AdamHyper hyper;
  zinf::kernels::AdamOptions options;
};

namespace zinf::capi {

// zinf_adam_step's work: checks the arguments (naming the bad one) and runs the SIMD step.
Status Step(zinf_adam* a, int64_t step, float lr, float* param, const void* grad, int grad_dtype,
            float* exp_avg, float* exp_avg_sq, uint64_t n, void* param16_out, int param16_dtype);

}  // namespace zinf::capi
