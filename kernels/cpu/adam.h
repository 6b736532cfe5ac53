// kernels/cpu/adam.h — the optimizer step for offloaded state: Adam and AdamW over flat fp32
// master weights, on every core, at memory speed.
//
// Contract. For every element i in [0, n), with t = hyper.step (1-based), PyTorch's semantics
// (torch.optim.Adam / AdamW, amsgrad=False, maximize=False):
//
//   g  = grad[i] * grad_scale                  grad read as fp32, bf16 or fp16
//   g += weight_decay * p                      Adam only (L2 folded into the gradient)
//   p *= 1 - lr * weight_decay                 AdamW only (decoupled decay, before the update)
//   m  = beta1 * m + (1 - beta1) * g
//   v  = beta2 * v + (1 - beta2) * g * g
//   p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps)      eps added after the square root
//   param16_out[i] = p rounded to nearest even as bf16 or fp16 (when param16_out is set)
//
// where bc1 = 1 - beta1^t and bc2 = 1 - beta2^t, or both 1 when bias_correction is false. The
// per-element arithmetic is fp32 (fused multiply-adds in the SIMD variants, so variants differ
// by a few ulps); lr / bc1 and 1 / sqrt(bc2) are computed in double and rounded once. The
// 16-bit copy is bit for bit the rounding of the fp32 result written to param, in every
// variant (NaN stays NaN, see half_convert.h).
//
// bf16 optimizer state (state_type = kBf16) is an APPROXIMATION: m and v are widened to fp32,
// updated as above (the parameter update uses these fp32 values) and rounded to bf16 for
// storage, keeping 8 of fp32's 24 significant bits. It halves the state's memory and NVMe
// traffic; it does not match PyTorch's fp32 state. Two roundings:
// - to nearest even (stochastic_state false): an update smaller than half an ulp (2^-9 to 2^-8
//   of the value) is lost every time; with beta2 = 0.999, v can then never decrease (a step
//   moves it by at most 0.1%) and rises only when g*g is ~3x it or more;
// - stochastic (stochastic_state true): each element rounds up with probability equal to the
//   fraction dropped, from 16 random bits that are a hash of (state_seed, the element's index
//   in the call plus state_index_base, which moment): unbiased, so small updates survive on
//   average, and
//   deterministic — the same seed, inputs and n give the same bits in every variant, for any
//   thread count or chunking (half_convert.h: FloatToBf16Stochastic). Give each step and
//   tensor its own seed (StateRoundingSeed). Indexes wrap at 2^32 elements.
//
// Non-finite gradients. With options.check_finite, the gradients are scanned in parallel before
// anything is written; if any is inf or NaN, AdamStep returns found_nonfinite = true and leaves
// param, m, v and param16_out untouched, so a dynamic loss scaler can skip the step. The cost
// is one extra read of the gradient bytes (n * sizeof(grad type)), measured at +21-25% of a
// 64M-element fp32 step on 2 threads (one read stream per core moves less than the step's seven
// streams do). When gradients come from AccumulateGrad (grad_ops.h), its return value already
// says this for free: then leave check_finite off. Without the check, a non-finite gradient
// propagates into its element only.
// grad_scale must itself be finite; the check looks at the unscaled gradient.
//
// Buffers are spans: the offload pipeline may run a step on one shard while I/O moves others.
// Any alignment works; 64-byte aligned buffers are fastest.
// REQUIRES: the buffers do not overlap one another; none is modified by another thread during
// the call.
//
// Thread-safety: AdamStep is reentrant; concurrent calls on disjoint buffers are fine (calls
// with the same thread count share one oneTBB arena, see parallel.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kernels/cpu/dtype.h"
#include "kernels/cpu/kernel_options.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/variant.h"
#include "zinf/status.h"

namespace zinf::kernels {

struct AdamHyper {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  bool adamw = false;  // decoupled weight decay (AdamW) instead of L2 (Adam)
  bool bias_correction = true;
  int64_t step = 1;         // 1-based number of this step (PyTorch's state['step'] after +1)
  float grad_scale = 1.0f;  // multiplies every gradient: loss-scale unscaling, clipping
};

struct AdamBuffers {
  float* param = nullptr;             // (n) fp32 master weights, updated in place
  const void* grad = nullptr;         // (n) grad_type
  DType grad_type = DType::kF32;      // kF32, kBf16 or kF16
  void* exp_avg = nullptr;            // (n) state_type, updated in place
  void* exp_avg_sq = nullptr;         // (n) state_type, updated in place
  DType state_type = DType::kF32;     // kF32 or kBf16 (approximate, see above)
  void* param16_out = nullptr;        // (n) param16_type, written; null = no 16-bit copy
  DType param16_type = DType::kBf16;  // kBf16 or kF16
  size_t n = 0;
  bool stochastic_state = false;      // kBf16 state: stochastic rounding instead of nearest
  uint64_t state_seed = 0;            // its random stream (StateRoundingSeed)
  // The index of element 0 in the whole tensor: a chunk of a larger tensor given its offset
  // draws the bits the whole tensor's step draws for those elements (ZeRO chunks of a unit).
  uint64_t state_index_base = 0;
};

// The seed of the stochastic rounding of one tensor's moments at one step: a hash of a run's
// seed, the 1-based step and the tensor's stable number (a unit), so that a resumed run draws
// what the uninterrupted one drew.
uint64_t StateRoundingSeed(uint64_t run_seed, int64_t step, uint64_t tensor);

struct AdamOptions {
  KernelVariant variant = KernelVariant::kAuto;  // see variant.h (ZINF_ADAM_VARIANT)
  int threads = 0;                               // 0 = all cores; 1 = the calling thread only
  bool check_finite = false;                     // pre-scan the gradients (see above)
  size_t chunk_elems = kDefaultChunkElems;       // > 0; rounded up to a multiple of 64
  // Non-temporal stores for param16_out (write-only: plain stores would first read every line
  // they write). Measured at 64M elements on 2 threads: the bf16 copy adds ~6-9% to the step
  // with streaming stores, ~11-13% with plain ones (its bytes add 7%).
  bool stream_param16 = true;
  const RunObserver* observer = nullptr;  // per-thread runs, for tracing (parallel.h)
};

struct AdamStepInfo {
  bool found_nonfinite = false;  // true: a gradient was inf/NaN and nothing was modified
  KernelVariant variant = KernelVariant::kScalar;  // the variant that ran (never kAuto)
  int threads = 1;                                 // the thread count used
};

// Errors: InvalidArgument for null buffers (n > 0), unsupported dtype combinations, step < 1,
// hyper-parameters outside PyTorch's ranges (lr, eps, weight_decay >= 0; 0 <= beta < 1; all
// finite) or a non-finite grad_scale; FailedPrecondition for a variant this CPU lacks.
// Nothing is modified when an error is returned.
Result<AdamStepInfo> AdamStep(const AdamHyper& hyper, const AdamBuffers& buffers,
                              const AdamOptions& options = {});

// Many tensors in one call (a framework's parameter group: weights, biases, norms): tensor i
// stepped with hypers[i] (each its own step, lr, decay...), every result bit for bit what
// AdamStep gives it alone in the same variant. The tensors' elements are cut into chunks as one
// range (each tensor starting on a 64-element boundary of it, so chunk boundaries keep the
// buffers' alignment), so a few threads share many small tensors in one dispatch instead of
// one dispatch each. With check_finite, a non-finite gradient in any tensor leaves every tensor
// untouched (found_nonfinite). Errors as AdamStep's, naming the tensor's index; nothing is
// modified when one is returned. REQUIRES hypers.size() == buffers.size(); no two tensors'
// buffers overlap.
Result<AdamStepInfo> AdamStepMany(std::span<const AdamHyper> hypers,
                                  std::span<const AdamBuffers> buffers,
                                  const AdamOptions& options = {});

// Bytes one step moves per element (read + written), e.g. 28 for fp32 everything, 26 with bf16
// gradients, 30 with an fp32 step plus a 16-bit copy.
size_t AdamBytesPerElement(DType grad_type, DType state_type, bool has_param16);

}  // namespace zinf::kernels
