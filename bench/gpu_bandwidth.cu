// gpu_bandwidth — a small probe of what a GPU machine delivers, printed as one JSON line:
// pinned host<->device copy bandwidth (cudaMemcpyAsync, timed with CUDA events) and the rate of
// the CUDA ops' MatmulForward (kernels/cuda/layer_ops.h) in each GEMM precision.
//
//   gpu_bandwidth [--mib N] [--reps N] [--gemm N]   (defaults 256 MiB, 10 reps, 4096)
//
// {"device":"NVIDIA H200","h2d_gbps":..,"d2h_gbps":..,"copy_bytes":..,
//  "gemm_n":4096,"matmul_tflops_bf16":..,"matmul_tflops_tf32":..,"matmul_tflops_fp32":..}
// GB/s is 10^9 bytes per second. With no GPU it prints {"error": "..."} and exits 1.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "kernels/cuda/layer_ops.h"

namespace {

namespace gpu = zinf::kernels::cuda;

int Fail(std::string what) {
  for (char& c : what) {
    if (c == '"' || c == '\\' || c == '\n') c = '\'';
  }
  std::printf("{\"error\": \"%s\"}\n", what.c_str());
  return 1;
}

#define CHECK_CUDA(expr)                                                              \
  do {                                                                                \
    cudaError_t err_ = (expr);                                                        \
    if (err_ != cudaSuccess) return Fail(std::string(#expr) + ": " + cudaGetErrorString(err_)); \
  } while (0)

// Seconds per call of fn, over `reps` calls after one warm-up, timed with events on `stream`.
template <typename F>
double TimeIt(cudaStream_t stream, int reps, F fn, bool* ok) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  *ok = fn();
  cudaEventRecord(start, stream);
  for (int i = 0; i < reps && *ok; ++i) *ok = fn();
  cudaEventRecord(stop, stream);
  *ok = *ok && cudaEventSynchronize(stop) == cudaSuccess;
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms / 1e3 / reps;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 256;
  int reps = 10;
  int n = 4096;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--mib") == 0) mib = std::strtoull(argv[i + 1], nullptr, 10);
    else if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
    else if (std::strcmp(argv[i], "--gemm") == 0) n = std::atoi(argv[i + 1]);
    else return Fail(std::string("unknown flag ") + argv[i]);
  }
  if (mib == 0 || reps <= 0 || n <= 0) return Fail("--mib, --reps and --gemm must be > 0");
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return Fail(std::string("no CUDA device: ") + cudaGetErrorString(cudaGetLastError()));
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  const size_t bytes = mib << 20;
  void* host = nullptr;
  void* dev = nullptr;
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  CHECK_CUDA(cudaMallocHost(&host, bytes));
  CHECK_CUDA(cudaMalloc(&dev, bytes));
  std::memset(host, 1, bytes);
  bool ok = true;
  const double h2d = TimeIt(stream, reps, [&] {
    return cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream) == cudaSuccess;
  }, &ok);
  if (!ok) return Fail("host-to-device copy failed");
  const double d2h = TimeIt(stream, reps, [&] {
    return cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream) == cudaSuccess;
  }, &ok);
  if (!ok) return Fail("device-to-host copy failed");
  CHECK_CUDA(cudaFreeHost(host));
  CHECK_CUDA(cudaFree(dev));

  // out[n,n] = inp[n,n]·W[n,n]ᵀ + bias through the ops' MatmulForward.
  const size_t elems = static_cast<size_t>(n) * n;
  float *inp = nullptr, *w = nullptr, *out = nullptr, *bias = nullptr;
  CHECK_CUDA(cudaMalloc(&inp, elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&w, elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&out, elems * sizeof(float)));
  CHECK_CUDA(cudaMalloc(&bias, n * sizeof(float)));
  if (!gpu::Fill(inp, 0.01f, elems, stream).ok() || !gpu::Fill(w, 0.02f, elems, stream).ok() ||
      !gpu::Fill(bias, 0.0f, n, stream).ok()) {
    return Fail("Fill failed");
  }
  auto handle = gpu::CublasHandle::Create();
  if (!handle.ok()) return Fail(handle.status().ToString());
  double tflops[3] = {0, 0, 0};
  const gpu::GemmPrecision precisions[3] = {gpu::GemmPrecision::kBf16, gpu::GemmPrecision::kTf32,
                                            gpu::GemmPrecision::kFp32};
  std::string gemm_error;
  for (int p = 0; p < 3; ++p) {
    (*handle)->set_precision(precisions[p]);
    const double s = TimeIt(stream, reps, [&] {
      zinf::Status st = gpu::MatmulForward(out, inp, w, bias, n, n, n, **handle, stream);
      if (!st.ok()) gemm_error = st.ToString();
      return st.ok();
    }, &ok);
    if (!ok) return Fail("MatmulForward failed: " + gemm_error);
    tflops[p] = 2.0 * n * static_cast<double>(n) * n / s / 1e12;
  }
  handle->reset();
  cudaFree(inp);
  cudaFree(w);
  cudaFree(out);
  cudaFree(bias);
  cudaStreamDestroy(stream);
  std::printf("{\"device\":\"%s\",\"h2d_gbps\":%.2f,\"d2h_gbps\":%.2f,\"copy_bytes\":%zu,"
              "\"gemm_n\":%d,\"matmul_tflops_bf16\":%.1f,\"matmul_tflops_tf32\":%.1f,"
              "\"matmul_tflops_fp32\":%.1f}\n",
              prop.name, bytes / h2d / 1e9, bytes / d2h / 1e9, bytes, n, tflops[0], tflops[1],
              tflops[2]);
  return 0;
}
