// src/train/backend.h — the Backend seam: the compute a decoder block needs, on one device.
//
// Contract. A Backend<T> runs the GPT-2 layer ops (their math and layouts are those of
// kernels/cpu/layer_ops.h: llm.c's) on memory of its device, in the order they are called:
// - CpuBackend (cpu_backend.h): the CPU ops, run at once on the calling thread, on host memory
//   (the host-emulated device's memory is host memory). T = float for training, double for the
//   gradient checks.
// - CudaBackend (cuda_backend.h): the CUDA ops (cuBLAS + our kernels), enqueued on one CUDA
//   stream; T = float only. Calls return once the work is enqueued.
// Either way a caller that hands results to another stream or to the host calls Synchronize()
// first. Every op returns a Status (launch or cuBLAS errors on CUDA, bad arguments on both).
// Backward ops ACCUMULATE into their gradient outputs (RopeBackward alone rotates in place).
// The Llama-family ops (kernels/cpu/llama_ops.h's math and layouts) have a default that
// returns Unimplemented naming the op and the backend, so a backend without them refuses a
// Llama model at its first call instead of computing something else.
// The same model code (gpt.h, llama.h) runs on both: it only calls this interface.
//
// Thread-safety: a Backend is used by one thread at a time (the layer executor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/dtype.h"
#include "zinf/status.h"

namespace zinf::train {

// InvalidArgument naming the op unless every dimension is positive (both backends check so).
inline Status CheckShape(const char* op, std::initializer_list<long> dims) {
  for (long d : dims) {
    if (d <= 0) return InvalidArgument(std::string(op) + ": dimensions must be positive");
  }
  return Status::Ok();
}

template <typename T>
class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;  // "cpu" or "cuda"

  virtual Status EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B,
                                int seq, int C) = 0;
  virtual Status EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B,
                                 int seq, int C) = 0;
  virtual Status LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight,
                                  const T* bias, int N, int C) = 0;
  virtual Status LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                                   const T* weight, const T* mean, const T* rstd, int N,
                                   int C) = 0;
  virtual Status MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int C,
                               int OC) = 0;
  virtual Status MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                                const T* weight, int N, int C, int OC) = 0;
  // scratch: AttentionScratchElems(...) elements, used by forward and backward alike; att is
  // kept between a forward and its backward (the probabilities).
  virtual size_t AttentionScratchElems(int B, int seq, int C, int NH) const = 0;
  virtual Status AttentionForward(T* out, T* att, T* scratch, const T* qkv, int B, int seq, int C,
                                  int NH) = 0;
  virtual Status AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                                   int B, int seq, int C, int NH) = 0;
  virtual Status GeluForward(T* out, const T* inp, size_t n) = 0;
  virtual Status GeluBackward(T* dinp, const T* inp, const T* dout, size_t n) = 0;
  virtual Status ResidualForward(T* out, const T* a, const T* b, size_t n) = 0;
  virtual Status AddInPlace(T* dst, const T* src, size_t n) = 0;
  virtual Status CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets,
                                     int N, int V) = 0;
  // dlogits[i,:] += dloss_each * (probs[i,:] - onehot(targets[i])): one dloss for every row.
  virtual Status CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets,
                                      T dloss_each, int N, int V) = 0;

  // Whether the Llama-family ops below are implemented (the layer executor refuses a Llama
  // model at start on a backend without them).
  virtual bool HasLlamaOps() const { return false; }
  // ---- Llama-family ops (llama_ops.h). qkv rows are [q H·d | k KV·d | v KV·d], gu rows
  // [gate I | up I]; cos and sin are RopeTables' [seq, d/2] tables in this device's memory.
  virtual Status TokenEmbeddingForward(T* out, const int32_t* tokens, const T* wte, int N,
                                       int C) {
    return Missing("TokenEmbeddingForward");
  }
  virtual Status TokenEmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int N,
                                        int C) {
    return Missing("TokenEmbeddingBackward");
  }
  virtual Status RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int N, int C,
                                double eps) {
    return Missing("RmsNormForward");
  }
  virtual Status RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp,
                                 const T* weight, const T* rstd, int N, int C) {
    return Missing("RmsNormBackward");
  }
  virtual Status RopeTables(T* cos, T* sin, const std::vector<float>& inv_freq, int seq) {
    return Missing("RopeTables");
  }
  virtual Status RopeForward(T* qkv, const T* cos, const T* sin, int B, int seq, int H, int KV,
                             int d) {
    return Missing("RopeForward");
  }
  virtual Status RopeBackward(T* dqkv, const T* cos, const T* sin, int B, int seq, int H,
                              int KV, int d) {
    return Missing("RopeBackward");
  }
  // scratch of CausalAttentionForward and Backward alike; att [B, H, seq, seq] is kept between
  // a forward and its backward.
  virtual size_t CausalAttentionScratchElems(int B, int seq, int H, int KV, int d) const {
    return 0;
  }
  virtual Status CausalAttentionForward(T* out, T* att, T* scratch, const T* qkv, int B, int seq,
                                        int H, int KV, int d) {
    return Missing("CausalAttentionForward");
  }
  virtual Status CausalAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv,
                                         const T* att, int B, int seq, int H, int KV, int d) {
    return Missing("CausalAttentionBackward");
  }
  virtual Status SwiGluForward(T* out, const T* gu, int N, int I) {
    return Missing("SwiGluForward");
  }
  virtual Status SwiGluBackward(T* dgu, const T* dout, const T* gu, int N, int I) {
    return Missing("SwiGluBackward");
  }

  // Takes, at start, the device memory the backend's own buffers need for up to `rows` rows
  // (the CUDA backend's per-row loss gradient), so that a tight budget fails at start and not
  // mid-run; ReserveBytes says how much that is.
  virtual Status Reserve(size_t rows) { return Status::Ok(); }
  virtual uint64_t ReserveBytes(size_t rows) const { return 0; }
  // True when ops run at once on the calling thread (the CPU backend): work another stream
  // must finish first is then waited for on the host (EventSynchronize), and the backend's own
  // work is done when the op returns. False when ops are enqueued on a stream (CUDA): the
  // stream waits (StreamWaitEvent) and an event recorded on it marks the work's end.
  virtual bool RunsOnCallingThread() const = 0;

  virtual Status Zero(T* x, size_t n) = 0;
  // out[i] = in[i] widened from a 16-bit type (bf16 or fp16) or copied from fp32 (T = float only;
  // Unimplemented for double).
  virtual Status Widen(T* out, const void* in, kernels::DType type, size_t n) = 0;
  // out[i] = in[i] rounded to nearest even as bf16 or fp16 (T = float only): the gradients
  // handed to the host in the working precision, as a GPU would send them.
  virtual Status Narrow(void* out, const T* in, kernels::DType type, size_t n) = 0;
  // Waits until every op called so far has finished; their first error.
  virtual Status Synchronize() = 0;

 protected:
  Status Missing(const char* op) const {
    return Unimplemented(std::string(op) + ": the " + std::string(name()) +
                         " backend has no Llama-family ops yet");
  }
};

}  // namespace zinf::train
