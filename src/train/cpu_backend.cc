#include "src/train/cpu_backend.h"

#include <cstring>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "kernels/cpu/cast.h"
#include "kernels/cpu/llama_ops.h"

namespace zinf::train {
namespace {

namespace ops = kernels::cpu;

template <typename T>
class CpuBackend final : public Backend<T> {
 public:
  explicit CpuBackend(const ops::OpOptions& o) : o_(o) {}
  std::string_view name() const override { return "cpu"; }

  Status EncoderForward(T* out, const int32_t* tokens, const T* wte, const T* wpe, int B, int seq,
                        int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("EncoderForward", {B, seq, C}));
    ops::EncoderForward(out, tokens, wte, wpe, B, seq, C, o_);
    return Status::Ok();
  }
  Status EncoderBackward(T* dwte, T* dwpe, const T* dout, const int32_t* tokens, int B, int seq,
                         int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("EncoderBackward", {B, seq, C}));
    ops::EncoderBackward(dwte, dwpe, dout, tokens, B, seq, C, o_);
    return Status::Ok();
  }
  Status LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias,
                          int N, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("LayerNormForward", {N, C}));
    ops::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, o_);
    return Status::Ok();
  }
  Status LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                           const T* weight, const T* mean, const T* rstd, int N, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("LayerNormBackward", {N, C}));
    ops::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C, o_);
    return Status::Ok();
  }
  Status MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int C,
                       int OC) override {
    ZINF_RETURN_IF_ERROR(CheckShape("MatmulForward", {N, C, OC}));
    ops::MatmulForward(out, inp, weight, bias, N, C, OC, o_);
    return Status::Ok();
  }
  Status MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp,
                        const T* weight, int N, int C, int OC) override {
    ZINF_RETURN_IF_ERROR(CheckShape("MatmulBackward", {N, C, OC}));
    ops::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, o_);
    return Status::Ok();
  }
  size_t AttentionScratchElems(int B, int seq, int C, int NH) const override {
    return ops::AttentionBackwardScratchElems(B, seq, C, NH);
  }
  Status AttentionForward(T* out, T* att, T* /*scratch*/, const T* qkv, int B, int seq, int C,
                          int NH) override {
    ZINF_RETURN_IF_ERROR(CheckShape("AttentionForward", {B, seq, C, NH}));
    if (C % NH != 0) return InvalidArgument("AttentionForward: C must be divisible by NH");
    ops::AttentionForward(out, att, qkv, B, seq, C, NH, o_);
    return Status::Ok();
  }
  Status AttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att, int B,
                           int seq, int C, int NH) override {
    ZINF_RETURN_IF_ERROR(CheckShape("AttentionBackward", {B, seq, C, NH}));
    ops::AttentionBackward(dqkv, scratch, dout, qkv, att, B, seq, C, NH, o_);
    return Status::Ok();
  }
  Status GeluForward(T* out, const T* inp, size_t n) override {
    ops::GeluForward(out, inp, n, o_);
    return Status::Ok();
  }
  Status GeluBackward(T* dinp, const T* inp, const T* dout, size_t n) override {
    ops::GeluBackward(dinp, inp, dout, n, o_);
    return Status::Ok();
  }
  Status ResidualForward(T* out, const T* a, const T* b, size_t n) override {
    ops::ResidualForward(out, a, b, n, o_);
    return Status::Ok();
  }
  Status AddInPlace(T* dst, const T* src, size_t n) override {
    ops::AddInPlace(dst, src, n, o_);
    return Status::Ok();
  }
  Status CrossEntropyForward(T* losses, T* probs, const T* logits, const int32_t* targets, int N,
                             int V) override {
    ZINF_RETURN_IF_ERROR(CheckShape("CrossEntropyForward", {N, V}));
    ops::CrossEntropyForward(losses, probs, logits, targets, N, V, o_);
    return Status::Ok();
  }
  Status CrossEntropyBackward(T* dlogits, const T* probs, const int32_t* targets, T dloss_each,
                              int N, int V) override {
    ZINF_RETURN_IF_ERROR(CheckShape("CrossEntropyBackward", {N, V}));
    dloss_.assign(static_cast<size_t>(N), dloss_each);
    ops::CrossEntropyBackward(dlogits, probs, targets, dloss_.data(), N, V, o_);
    return Status::Ok();
  }
  bool HasLlamaOps() const override { return true; }
  Status TokenEmbeddingForward(T* out, const int32_t* tokens, const T* wte, int N,
                               int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("TokenEmbeddingForward", {N, C}));
    ops::TokenEmbeddingForward(out, tokens, wte, N, C, o_);
    return Status::Ok();
  }
  Status TokenEmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int N,
                                int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("TokenEmbeddingBackward", {N, C}));
    ops::TokenEmbeddingBackward(dwte, dout, tokens, N, C, o_);
    return Status::Ok();
  }
  Status RmsNormForward(T* out, T* rstd, const T* inp, const T* weight, int N, int C,
                        double eps) override {
    ZINF_RETURN_IF_ERROR(CheckShape("RmsNormForward", {N, C}));
    ops::RmsNormForward(out, rstd, inp, weight, N, C, eps, o_);
    return Status::Ok();
  }
  Status RmsNormBackward(T* dinp, T* dweight, const T* dout, const T* inp, const T* weight,
                         const T* rstd, int N, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("RmsNormBackward", {N, C}));
    ops::RmsNormBackward(dinp, dweight, dout, inp, weight, rstd, N, C, o_);
    return Status::Ok();
  }
  Status RopeTables(T* cos, T* sin, const std::vector<float>& inv_freq, int seq) override {
    ZINF_RETURN_IF_ERROR(CheckShape("RopeTables", {long(inv_freq.size()), seq}));
    ops::RopeTables(cos, sin, inv_freq, seq);
    return Status::Ok();
  }
  Status RopeForward(T* qkv, const T* cos, const T* sin, int B, int seq, int H, int KV,
                     int d) override {
    ZINF_RETURN_IF_ERROR(CheckHeads("RopeForward", B, seq, H, KV, d));
    ops::RopeForward(qkv, cos, sin, B, seq, H, KV, d, o_);
    return Status::Ok();
  }
  Status RopeBackward(T* dqkv, const T* cos, const T* sin, int B, int seq, int H, int KV,
                      int d) override {
    ZINF_RETURN_IF_ERROR(CheckHeads("RopeBackward", B, seq, H, KV, d));
    ops::RopeBackward(dqkv, cos, sin, B, seq, H, KV, d, o_);
    return Status::Ok();
  }
  size_t CausalAttentionScratchElems(int B, int seq, int H, int KV, int d) const override {
    return ops::CausalAttentionScratchElems(B, seq, KV);
  }
  Status CausalAttentionForward(T* out, T* att, T* /*scratch*/, const T* qkv, int B, int seq,
                                int H, int KV, int d) override {
    ZINF_RETURN_IF_ERROR(CheckHeads("CausalAttentionForward", B, seq, H, KV, d));
    ops::CausalAttentionForward(out, att, qkv, B, seq, H, KV, d, o_);
    return Status::Ok();
  }
  Status CausalAttentionBackward(T* dqkv, T* scratch, const T* dout, const T* qkv, const T* att,
                                 int B, int seq, int H, int KV, int d) override {
    ZINF_RETURN_IF_ERROR(CheckHeads("CausalAttentionBackward", B, seq, H, KV, d));
    ops::CausalAttentionBackward(dqkv, scratch, dout, qkv, att, B, seq, H, KV, d, o_);
    return Status::Ok();
  }
  Status SwiGluForward(T* out, const T* gu, int N, int I) override {
    ZINF_RETURN_IF_ERROR(CheckShape("SwiGluForward", {N, I}));
    ops::SwiGluForward(out, gu, N, I, o_);
    return Status::Ok();
  }
  Status SwiGluBackward(T* dgu, const T* dout, const T* gu, int N, int I) override {
    ZINF_RETURN_IF_ERROR(CheckShape("SwiGluBackward", {N, I}));
    ops::SwiGluBackward(dgu, dout, gu, N, I, o_);
    return Status::Ok();
  }
  Status Zero(T* x, size_t n) override {
    if (n > 0) std::memset(x, 0, n * sizeof(T));
    return Status::Ok();
  }
  Status Widen(T* out, const void* in, kernels::DType type, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      if (type == kernels::DType::kF32) {
        std::memcpy(out, in, n * sizeof(float));
        return Status::Ok();
      }
      return kernels::CastToF32(in, type, out, n);
    } else {
      return Unimplemented("Widen: the double backend takes its weights as double");
    }
  }
  Status Narrow(void* out, const T* in, kernels::DType type, size_t n) override {
    if constexpr (std::is_same_v<T, float>) {
      return kernels::CastFromF32(in, out, type, n);
    } else {
      return Unimplemented("Narrow: the double backend keeps its gradients in double");
    }
  }
  Status Synchronize() override { return Status::Ok(); }
  bool RunsOnCallingThread() const override { return true; }

 private:
  static Status CheckHeads(const char* op, int B, int seq, int H, int KV, int d) {
    ZINF_RETURN_IF_ERROR(CheckShape(op, {B, seq, H, KV, d}));
    if (H % KV != 0 || d % 2 != 0) {
      return InvalidArgument(fmt::format("{}: {} heads are not a multiple of {} key/value heads, "
                                         "or head_dim {} is odd", op, H, KV, d));
    }
    return Status::Ok();
  }

  ops::OpOptions o_;
  std::vector<T> dloss_;  // (N) the per-row loss gradient the CPU op takes
};

}  // namespace

template <typename T>
std::unique_ptr<Backend<T>> MakeCpuBackend(const kernels::cpu::OpOptions& options) {
  return std::make_unique<CpuBackend<T>>(options);
}

template std::unique_ptr<Backend<float>> MakeCpuBackend<float>(const kernels::cpu::OpOptions&);
template std::unique_ptr<Backend<double>> MakeCpuBackend<double>(const kernels::cpu::OpOptions&);

}  // namespace zinf::train
