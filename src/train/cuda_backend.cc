#include "src/train/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>

#include <fmt/format.h>

namespace zinf::train {
namespace {

namespace ops = kernels::cuda;

class CudaBackend final : public Backend<float> {
 public:
  CudaBackend(Device& device, Stream* compute, DeviceArena* arena, void* workspace)
      : device_(device),
        compute_(compute),
        stream_(compute->NativeHandle()),
        arena_(arena),
        workspace_(workspace) {}

  Status Init(kernels::cuda::GemmPrecision precision) {
    auto cublas = ops::CublasHandle::Create(precision, workspace_,
                                            workspace_ ? ops::kCublasWorkspaceBytes : 0);
    if (!cublas.ok()) return cublas.status().WithContext("MakeCudaBackend");
    cublas_ = std::move(*cublas);
    return Status::Ok();
  }

  ~CudaBackend() override {
    // Enqueued work may still use the buffers.
    device_.StreamSynchronize(compute_).IgnoreError();
    cublas_.reset();
    FreeDevice(dloss_).IgnoreError();
    FreeDevice(workspace_).IgnoreError();
  }

  bool RunsOnCallingThread() const override { return false; }
  uint64_t ReserveBytes(size_t rows) const override {
    return (rows * sizeof(float) + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  }

  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string_view name() const override { return "cuda"; }

  Status EncoderForward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                        int B, int seq, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("EncoderForward", {B, seq, C}));
    return ops::EncoderForward(out, tokens, wte, wpe, B, seq, C, stream_);
  }
  Status EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                         int B, int seq, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("EncoderBackward", {B, seq, C}));
    return ops::EncoderBackward(dwte, dwpe, dout, tokens, B, seq, C, stream_);
  }
  Status LayerNormForward(float* out, float* mean, float* rstd, const float* inp,
                          const float* weight, const float* bias, int N, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("LayerNormForward", {N, C}));
    return ops::LayerNormForward(out, mean, rstd, inp, weight, bias, N, C, stream_);
  }
  Status LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                           const float* inp, const float* weight, const float* mean,
                           const float* rstd, int N, int C) override {
    ZINF_RETURN_IF_ERROR(CheckShape("LayerNormBackward", {N, C}));
    return ops::LayerNormBackward(dinp, dweight, dbias, dout, inp, weight, mean, rstd, N, C,
                                  stream_);
  }
  Status MatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                       int N, int C, int OC) override {
    ZINF_RETURN_IF_ERROR(CheckShape("MatmulForward", {N, C, OC}));
    return ops::MatmulForward(out, inp, weight, bias, N, C, OC, *cublas_, stream_);
  }
  Status MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                        const float* inp, const float* weight, int N, int C, int OC) override {
    ZINF_RETURN_IF_ERROR(CheckShape("MatmulBackward", {N, C, OC}));
    return ops::MatmulBackward(dinp, dweight, dbias, dout, inp, weight, N, C, OC, *cublas_,
                               stream_);
  }
  // The model passes one scratch to both directions (gpt.cc: BlockForward's attention scratch is
  // BlockBackward's), so it must hold either.
  size_t AttentionScratchElems(int B, int seq, int C, int NH) const override {
    return std::max(ops::AttentionForwardScratchElems(B, seq, C, NH),
                    ops::AttentionBackwardScratchElems(B, seq, C, NH));
  }
  Status AttentionForward(float* out, float* att, float* scratch, const float* qkv, int B,
                          int seq, int C, int NH) override {
    ZINF_RETURN_IF_ERROR(CheckShape("AttentionForward", {B, seq, C, NH}));
    if (C % NH != 0) return InvalidArgument("AttentionForward: C must be divisible by NH");
    return ops::AttentionForward(out, att, scratch, qkv, B, seq, C, NH, *cublas_, stream_);
  }
  Status AttentionBackward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                           const float* att, int B, int seq, int C, int NH) override {
    ZINF_RETURN_IF_ERROR(CheckShape("AttentionBackward", {B, seq, C, NH}));
    if (C % NH != 0) return InvalidArgument("AttentionBackward: C must be divisible by NH");
    return ops::AttentionBackward(dqkv, scratch, dout, qkv, att, B, seq, C, NH, *cublas_,
                                  stream_);
  }
  Status GeluForward(float* out, const float* inp, size_t n) override {
    return ops::GeluForward(out, inp, n, stream_);
  }
  Status GeluBackward(float* dinp, const float* inp, const float* dout, size_t n) override {
    return ops::GeluBackward(dinp, inp, dout, n, stream_);
  }
  Status ResidualForward(float* out, const float* a, const float* b, size_t n) override {
    return ops::ResidualForward(out, a, b, n, stream_);
  }
  Status AddInPlace(float* dst, const float* src, size_t n) override {
    return ops::AddInPlace(dst, src, n, stream_);
  }
  Status CrossEntropyForward(float* losses, float* probs, const float* logits,
                             const int32_t* targets, int N, int V) override {
    ZINF_RETURN_IF_ERROR(CheckShape("CrossEntropyForward", {N, V}));
    return ops::CrossEntropyForward(losses, probs, logits, targets, N, V, stream_);
  }
  Status Reserve(size_t rows) override { return FillDloss(0.0f, rows); }
  Status CrossEntropyBackward(float* dlogits, const float* probs, const int32_t* targets,
                              float dloss_each, int N, int V) override {
    ZINF_RETURN_IF_ERROR(CheckShape("CrossEntropyBackward", {N, V}));
    ZINF_RETURN_IF_ERROR(FillDloss(dloss_each, static_cast<size_t>(N)));
    return ops::CrossEntropyBackward(dlogits, probs, targets, dloss_, N, V, stream_);
  }

  Status Zero(float* x, size_t n) override { return ops::Fill(x, 0.0f, n, stream_); }
  Status Widen(float* out, const void* in, kernels::DType type, size_t n) override {
    switch (type) {
      case kernels::DType::kF32:
        return device_.CopyOnDevice(compute_, out, in, n * sizeof(float)).WithContext("Widen");
      case kernels::DType::kBf16:
        return ops::Bf16ToFloat(out, static_cast<const uint16_t*>(in), n, stream_);
      case kernels::DType::kF16:
        return ops::Fp16ToFloat(out, static_cast<const uint16_t*>(in), n, stream_);
    }
    return InvalidArgument("Widen: unknown source type");
  }
  Status Narrow(void* out, const float* in, kernels::DType type, size_t n) override {
    switch (type) {
      case kernels::DType::kBf16:
        return ops::FloatToBf16(static_cast<uint16_t*>(out), in, n, stream_);
      case kernels::DType::kF16:
        return ops::FloatToFp16(static_cast<uint16_t*>(out), in, n, stream_);
      case kernels::DType::kF32:
        break;
    }
    return InvalidArgument("Narrow: the 16-bit type must be bf16 or fp16");
  }
  Status Synchronize() override {
    return device_.StreamSynchronize(compute_).WithContext("CudaBackend::Synchronize");
  }

 private:
  Status FreeDevice(void* p) {
    if (p == nullptr) return Status::Ok();
    return arena_ != nullptr ? arena_->Free(p) : device_.Free(p);
  }

  // Makes dloss_[0, n) hold `value` for the work enqueued next: grows the buffer (after the
  // stream has drained, since enqueued work may still read the old one) and refills it only when
  // the value's bits or the count changed; stream order makes an earlier fill visible.
  Status FillDloss(float value, size_t n) {
    const uint32_t bits = std::bit_cast<uint32_t>(value);
    if (n > dloss_capacity_) {
      if (dloss_ != nullptr) {
        ZINF_RETURN_IF_ERROR(
            device_.StreamSynchronize(compute_).WithContext("CrossEntropyBackward"));
        ZINF_RETURN_IF_ERROR(FreeDevice(dloss_).WithContext("CrossEntropyBackward"));
        dloss_ = nullptr;
        dloss_capacity_ = 0;
        dloss_filled_ = 0;
      }
      auto p = arena_ != nullptr ? arena_->Allocate(n * sizeof(float), "the per-row dloss buffer")
                                 : device_.Allocate(n * sizeof(float));
      if (!p.ok()) {
        return p.status().WithContext(
            fmt::format("CrossEntropyBackward: the per-row dloss buffer of {} floats", n));
      }
      dloss_ = static_cast<float*>(*p);
      dloss_capacity_ = n;
    }
    if (dloss_filled_ >= n && dloss_bits_ == bits) return Status::Ok();
    ZINF_RETURN_IF_ERROR(ops::Fill(dloss_, value, n, stream_));
    dloss_filled_ = n;
    dloss_bits_ = bits;
    return Status::Ok();
  }

  Device& device_;
  Stream* const compute_;
  void* const stream_;  // compute_'s cudaStream_t
  DeviceArena* const arena_;  // buffers come from here when set, else from Device::Allocate
  void* const workspace_;     // the cuBLAS workspace (a block of arena_), or null
  std::unique_ptr<ops::CublasHandle> cublas_;
  float* dloss_ = nullptr;    // (dloss_capacity_) device floats, from device_.Allocate
  size_t dloss_capacity_ = 0;
  size_t dloss_filled_ = 0;   // dloss_[0, dloss_filled_) hold the value of dloss_bits_
  uint32_t dloss_bits_ = 0;
};

}  // namespace

Result<std::unique_ptr<Backend<float>>> MakeCudaBackend(Device& device, Stream* compute,
                                                        kernels::cuda::GemmPrecision precision,
                                                        DeviceArena* arena) {
  if (device.kind() != DeviceKind::kCuda) {
    return InvalidArgument(fmt::format("MakeCudaBackend: the device is {}, not cuda ({})",
                                       DeviceKindName(device.kind()), device.Describe()));
  }
  if (compute == nullptr) return InvalidArgument("MakeCudaBackend: no compute stream");
  if (compute->device() != &device) {
    return InvalidArgument(fmt::format(
        "MakeCudaBackend: the compute stream '{}' belongs to another device", compute->name()));
  }
  if (compute->NativeHandle() == nullptr) {
    return InvalidArgument(fmt::format(
        "MakeCudaBackend: the compute stream '{}' has no native CUDA stream", compute->name()));
  }
  if (arena != nullptr && &arena->device() != &device) {
    return InvalidArgument("MakeCudaBackend: the device arena belongs to another device");
  }
  ZINF_RETURN_IF_ERROR(device.BindCurrentThread());
  void* workspace = nullptr;
  if (arena != nullptr) {
    auto ws = arena->Allocate(kernels::cuda::kCublasWorkspaceBytes, "the cuBLAS workspace");
    if (!ws.ok()) return ws.status().WithContext("MakeCudaBackend");
    workspace = *ws;
  }
  auto be = std::make_unique<CudaBackend>(device, compute, arena, workspace);
  ZINF_RETURN_IF_ERROR(be->Init(precision));
  return std::unique_ptr<Backend<float>>(std::move(be));
}

}  // namespace zinf::train
