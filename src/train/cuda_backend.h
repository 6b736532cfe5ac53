// src/train/cuda_backend.h — the CUDA Backend: kernels/cuda/layer_ops.h on one CUDA stream.
//
// Contract: every op checks its shapes (positive, as the CPU backend does; InvalidArgument
// naming the op otherwise) and then ENQUEUES the CUDA op on the compute stream's native
// cudaStream_t and returns: its Status is the launch or cuBLAS error of that enqueue (which also
// reports a sticky fault of earlier work), not the outcome of the work. Synchronize() waits on the
// compute stream through Device::StreamSynchronize and returns its first error. Pointers are
// device memory of `device` (int32 tokens and targets too); scalars are host values.
// - GEMMs (Matmul*, the attention's batched GEMMs) run through one cuBLAS handle owned by the
//   backend, created by MakeCudaBackend on the calling thread's current CUDA device, with
//   `precision` (default kBf16: bf16 tensor cores, fp32 accumulation; kFp32 is exact fp32, what
//   the comparisons with the CPU use). The handle is bound to the compute stream on every call.
// - AttentionScratchElems is the larger of the CUDA attention forward and backward scratch (the
//   model hands the same scratch to both).
// - CrossEntropyBackward's scalar dloss_each is expanded into a device buffer of N floats (the
//   CUDA op takes one dloss per row), taken by Reserve(rows) at start (ReserveBytes(rows): 4·N
//   bytes rounded up to kDeviceAlignment) from the arena (else Device::Allocate), and grown
//   (after synchronizing the stream) only if a later N exceeds it. It is refilled only when
//   dloss_each or N changes.
// - The caller's thread must be bound to the device (Device::BindCurrentThread; the executor
//   binds before each micro-batch): kernels go to the thread's current device.
// - Zero = Fill(0). Widen: bf16/fp16 through Bf16ToFloat/Fp16ToFloat; kF32 is a device-to-device
//   copy enqueued with Device::CopyOnDevice on the compute stream (so `in` must lie inside one live
//   allocation of `device`). Narrow: FloatToBf16/FloatToFp16 (bit for bit the CPU's rounding);
//   kF32 is refused as on the CPU (the 16-bit type must be bf16 or fp16).
// - Results match the CPU backend up to rounding: summation order and the GEMM precision
//   (tests/cuda/cuda_backend_test.cc states the tolerances); deterministic run to run on one GPU.
// MakeCudaBackend refuses (InvalidArgument) a device that is not CUDA, a null stream, a stream of
// another device or one without a native handle; a cuBLAS handle that cannot be created is
// returned as cuBLAS reports it (Unavailable without a GPU), prefixed with "MakeCudaBackend".
//
// Thread-safety: as Backend — one thread at a time, and that thread's current CUDA device must be
// `device`'s (CudaDevice makes it current on each of its calls from a thread; the trainer creates
// and uses the backend on one thread). REQUIRES: the device and the stream outlive the backend;
// destroying the backend synchronizes the compute stream before freeing its buffer.
//
// This header includes no CUDA header.
#pragma once

#include <memory>

#include "kernels/cuda/layer_ops.h"
#include "src/base/device.h"
#include "src/base/device_arena.h"
#include "src/train/backend.h"
#include "zinf/status.h"

namespace zinf::train {

// With `arena`, the cuBLAS workspace (kCublasWorkspaceBytes) and the dloss buffer are blocks of
// it, inside the device budget's one reservation; without, they come from Device::Allocate and
// cuBLAS's own pool (tests).
Result<std::unique_ptr<Backend<float>>> MakeCudaBackend(
    Device& device, Stream* compute,
    kernels::cuda::GemmPrecision precision = kernels::cuda::GemmPrecision::kBf16,
    DeviceArena* arena = nullptr);

}  // namespace zinf::train
