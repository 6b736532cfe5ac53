// tests/comm/fake_nccl/cuda_runtime.h — the part of CUDA's runtime API the NCCL transport uses,
// faked on the host (fake_nccl.cc), so the transport's own code runs and is tested on machines
// without a GPU, under the sanitizers too. Each function is renamed to zinf_fake_* so a test
// program can also link the real CUDA runtime.
//
// What the fake enforces (each breach is recorded, fake_nccl_control.h): a copy between the
// device and host memory that is not pinned (CUDA would run it synchronously: a wait with no
// timeout); any work queued on a stream whose NCCL communicator is still starting a call (NCCL's
// non-blocking rule). Streams run their work in order on a thread of their own; events complete
// when the stream reaches them.
#pragma once

#include <cstddef>

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidValue = 1,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorNotReady = 600,
};
enum cudaMemcpyKind { cudaMemcpyHostToDevice = 1, cudaMemcpyDeviceToHost = 2 };
struct zinf_fake_stream;
struct zinf_fake_event;
typedef zinf_fake_stream* cudaStream_t;
typedef zinf_fake_event* cudaEvent_t;
#define cudaStreamNonBlocking 0x01u
#define cudaEventDisableTiming 0x02u
#define cudaHostAllocDefault 0x00u

#define cudaGetErrorString zinf_fake_cudaGetErrorString
#define cudaGetErrorName zinf_fake_cudaGetErrorName
#define cudaGetDevice zinf_fake_cudaGetDevice
#define cudaSetDevice zinf_fake_cudaSetDevice
#define cudaFree zinf_fake_cudaFree
#define cudaDeviceGetPCIBusId zinf_fake_cudaDeviceGetPCIBusId
#define cudaStreamCreateWithFlags zinf_fake_cudaStreamCreateWithFlags
#define cudaStreamSynchronize zinf_fake_cudaStreamSynchronize
#define cudaStreamDestroy zinf_fake_cudaStreamDestroy
#define cudaEventCreateWithFlags zinf_fake_cudaEventCreateWithFlags
#define cudaEventRecord zinf_fake_cudaEventRecord
#define cudaEventQuery zinf_fake_cudaEventQuery
#define cudaEventDestroy zinf_fake_cudaEventDestroy
#define cudaHostAlloc zinf_fake_cudaHostAlloc
#define cudaFreeHost zinf_fake_cudaFreeHost
#define cudaMallocAsync zinf_fake_cudaMallocAsync
#define cudaFreeAsync zinf_fake_cudaFreeAsync
#define cudaMemcpyAsync zinf_fake_cudaMemcpyAsync

const char* cudaGetErrorString(cudaError_t e);
const char* cudaGetErrorName(cudaError_t e);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaFree(void* p);
cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned flags);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned flags);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventQuery(cudaEvent_t e);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned flags);
cudaError_t cudaFreeHost(void* p);
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t s);
cudaError_t cudaFreeAsync(void* p, cudaStream_t s);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s);
