// kernels/cuda/layer_ops.h — the CUDA ops of a GPT-2 decoder block, forward and backward.
//
// Contract. The same ops, layouts and arithmetic as kernels/cpu/layer_ops.h (llm.c's
// train_gpt2.cu), on device memory, float only. Read that header for the shapes; the
// differences are:
// - Every function takes a trailing `void* stream` (a cudaStream_t; nullptr is the legacy
//   default stream) and only ENQUEUES work on it: it returns before the work has run. Pointers
//   are device pointers (int32 tokens/targets too); scalars are host values.
// - Every function returns a Status: InvalidArgument for bad shapes (negative sizes,
//   C % NH != 0) before anything is enqueued, otherwise the launch error (cudaGetLastError,
//   which also reports a sticky fault of earlier work) or the cuBLAS error, named with the op.
//   Empty shapes are OK and enqueue nothing.
// - Matmul and attention GEMMs run through cuBLAS (cublasGemmEx / cublasGemmStridedBatchedEx on
//   fp32 buffers) with the CublasHandle's precision: kBf16 (default: bf16 tensor cores with
//   fp32 accumulation, CUBLAS_COMPUTE_32F_FAST_16BF), kTf32, or kFp32 (plain fp32,
//   CUBLAS_COMPUTE_32F: what the tests compare with the CPU).
// - Attention needs scratch device memory: AttentionForward/BackwardScratchElems floats, with
//   any contents on entry. AttentionForward's scratch has no counterpart on the CPU.
// - Every *Backward ACCUMULATES (+=) into its gradient outputs, as on the CPU (cuBLAS beta = 1).
// - Deterministic: the same inputs, precision, GPU model and library versions give the same
//   bits on every run. No op uses floating-point atomics: reductions run in a fixed order
//   (EncoderBackward adds each token's rows in position order, as the CPU loop does; column
//   sums for dbias/dweight of LayerNorm go through a fixed tree). cuBLAS is deterministic per
//   handle and stream (see CublasHandle).
// - Results match the CPU op up to rounding (summation order, expf/tanhf ulps, and for GEMMs
//   the chosen precision); tests/cuda/cuda_layer_ops_test.cc states the tolerances.
// - Sizes in elements fit in size_t; B*seq, C, OC, V fit in int as on the CPU.
//
// Thread-safety: the functions are reentrant. A CublasHandle serialises the enqueueing of its
// GEMMs with an internal mutex (cuBLAS binds a stream to a handle per call), so one handle may
// be shared by threads, but one handle per thread and stream avoids the contention.
// set_precision must not race with calls that use the handle.
//
// This header includes no CUDA header: code compiled by the host compiler (C++20) uses it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "zinf/status.h"

namespace zinf::kernels::cuda {

// Compute precision of the GEMMs (all buffers stay fp32).
enum class GemmPrecision {
  kBf16,  // CUBLAS_COMPUTE_32F_FAST_16BF: bf16 tensor cores, fp32 accumulation (default)
  kTf32,  // CUBLAS_COMPUTE_32F_FAST_TF32
  kFp32,  // CUBLAS_COMPUTE_32F: plain fp32, for the comparisons with the CPU
};
const char* GemmPrecisionName(GemmPrecision precision);  // "bf16", "tf32", "fp32"

// What cuBLAS asks for on Hopper (its documentation: 32 MiB; 4 MiB on older GPUs): the workspace
// zinf hands it from the device arena, so cuBLAS allocates none of its own.
inline constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

// Owns a cuBLAS handle on the current device (the one current when Create ran; calls must be
// made with that device current). Opaque so that this header stays free of CUDA types.
// With a workspace (device memory the caller owns, e.g. a block of the device arena) every GEMM
// uses it (set again after each cublasSetStream, which resets it); without one cuBLAS uses its
// own pool, allocated outside zinf's budget.
class CublasHandle {
 public:
  struct Impl;  // defined in kernels/cuda/cuda_util.cuh

  // Fails (Unavailable/Internal, naming cublasCreate) when no GPU answers.
  static Result<std::unique_ptr<CublasHandle>> Create(
      GemmPrecision precision = GemmPrecision::kBf16, void* workspace = nullptr,
      size_t workspace_bytes = 0);
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  GemmPrecision precision() const;
  void set_precision(GemmPrecision precision);

  Impl& impl() const { return *impl_; }  // for the .cu files

 private:
  explicit CublasHandle(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// ---- Embedding -------------------------------------------------------------------------------

// out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]. tokens in [0, V) (checked by the caller).
Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                      int B, int seq, int C, void* stream);
// dwte[tokens[b,t],:] += dout[b,t,:]; dwpe[t,:] += dout[b,t,:]. No atomics: each token's rows
// are added in position order by the block of its first occurrence, which scans the tokens 256
// at a time (up to N² compares in all for N = B*seq, cheap next to the GEMMs for N up to ~64k);
// the same bits as the CPU op.
Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                       int B, int seq, int C, void* stream);

// ---- LayerNorm -------------------------------------------------------------------------------

// Per row of C: mean, rstd = 1/sqrt(var + 1e-5), out = (x - mean) * rstd * w + b.
// mean, rstd: N values each, for backward.
Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                        const float* weight, const float* bias, int N, int C, void* stream);
Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                         const float* inp, const float* weight, const float* mean,
                         const float* rstd, int N, int C, void* stream);

// ---- Linear ----------------------------------------------------------------------------------

// out[N,OC] = inp[N,C] · weight[OC,C]ᵀ + bias[OC] (bias nullable).
Status MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                     int C, int OC, CublasHandle& cublas, void* stream);
// dinp[N,C] += dout·weight; dweight[OC,C] += doutᵀ·inp; dbias[OC] += Σ_rows dout.
// dinp and dbias nullable.
Status MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                      const float* inp, const float* weight, int N, int C, int OC,
                      CublasHandle& cublas, void* stream);

// ---- Attention -------------------------------------------------------------------------------

// qkv [B, seq, 3C] -> out [B, seq, C]; att [B, NH, seq, seq] = the causal softmax probabilities
// (zero above the diagonal), saved for backward. Computed as llm.c does: permute to q, k, v
// [B, NH, seq, hs], batched GEMM q·kᵀ into att, scaled causal softmax in place, batched GEMM
// att·v, unpermute.
size_t AttentionForwardScratchElems(int B, int seq, int C, int NH);
Status AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B, int seq,
                        int C, int NH, CublasHandle& cublas, void* stream);
// dqkv += ∂loss/∂qkv given dout (recomputes the permuted q, k, v into scratch).
size_t AttentionBackwardScratchElems(int B, int seq, int C, int NH);
Status AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                         const float* att, int B, int seq, int C, int NH, CublasHandle& cublas,
                         void* stream);

// ---- Elementwise -----------------------------------------------------------------------------

// GELU, tanh approximation.
Status GeluForward(float* out, const float* inp, size_t n, void* stream);
// dinp += gelu'(inp) * dout.
Status GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, void* stream);
// out = a + b (out may alias a or b).
Status ResidualForward(float* out, const float* a, const float* b, size_t n, void* stream);
// dst += src.
Status AddInPlace(float* dst, const float* src, size_t n, void* stream);

// ---- Loss ------------------------------------------------------------------------------------

// logits [N, V] -> probs [N, V] (may alias logits), losses[i] = -log probs[i, targets[i]]
// (computed as log Σexp - (x_t - max), finite even where the probability underflows).
// A target outside [0, V) gives a NaN loss instead of a wild read.
Status CrossEntropyForward(float* losses, float* probs, const float* logits,
                           const int32_t* targets, int N, int V, void* stream);
// dlogits[i,:] += dloss[i] * (probs[i,:] - onehot(targets[i])). dloss: N device values.
Status CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                            const float* dloss, int N, int V, void* stream);

// ---- Utilities -------------------------------------------------------------------------------

// *out (a device double) = Σ x² (or += with accumulate), summed in double in a fixed order
// that does not depend on the GPU. scratch: SumSquaresScratchElems() device doubles.
size_t SumSquaresScratchElems();
Status SumSquares(double* out, double* scratch, const float* x, size_t n, bool accumulate,
                  void* stream);

// Conversions, bit for bit those of kernels/cpu/half_convert.h: to 16 bits rounds to nearest,
// ties to even, a NaN stays a NaN (quiet bit set); to float is exact (fp16 quiets sNaN).
Status Bf16ToFloat(float* out, const uint16_t* in, size_t n, void* stream);
Status Fp16ToFloat(float* out, const uint16_t* in, size_t n, void* stream);
Status FloatToBf16(uint16_t* out, const float* in, size_t n, void* stream);
Status FloatToFp16(uint16_t* out, const float* in, size_t n, void* stream);

// out[i] = value.
Status Fill(float* out, float value, size_t n, void* stream);
// x[i] *= s.
Status Scale(float* x, float s, size_t n, void* stream);

}  // namespace zinf::kernels::cuda
