/* zinf/zinf.h — zinf's C ABI: what a framework embedding zinf as its offload backend calls.
 *
 * Contract.
 * - Plain C (C99), no zinf C++ header, no CUDA or liburing header. Every symbol is zinf_* (or
 *   ZINF_*), exported from libzinf.so under the version node ZINF_0.1 (symbols are only ever
 *   added); everything else in the library is hidden.
 * - Every call that can fail returns an int status: ZINF_OK (0) or a negative ZINF_E_* code.
 *   zinf_strerror(code) names the code; zinf_last_error() is the calling thread's message of
 *   its last failure (naming what failed and where: the path, the offset, the field), valid
 *   until that thread's next zinf call. zinf never aborts the calling process for bad input,
 *   and never calls back into the caller from its own threads. It logs warnings and errors to
 *   stderr (ZINF_LOG_LEVEL=info or debug for more, off for nothing).
 * - Structs passed in start with their size (`size`, set from the ZINF_*_INIT initializers), so
 *   later versions can append fields: a struct whose size is smaller than the first version's
 *   is refused (ZINF_E_INVALID_ARGUMENT), fields past a caller's size take their defaults.
 * - Handles (zinf_io, zinf_adam) are opaque; each is created by its open or create call and
 *   released by its close or destroy call, which accepts NULL.
 *
 * File I/O (DeepSpeed's aio_handle, on zinf's engine: io_uring, else libaio, else threads).
 * - zinf_io_pread / zinf_io_pwrite queue a transfer of `bytes` between `buf` and the file at
 *   `path` (opened on first use, O_DIRECT unless params.direct is 0; a write creates the file,
 *   mode 0600, and may extend it) and return at once. The buffer must stay valid and untouched
 *   until zinf_io_wait returns. With O_DIRECT, buf, offset and bytes must be aligned as the file
 *   system requires (the error names the alignment): zinf_pinned_alloc's buffers are.
 * - zinf_io_wait waits for every transfer queued on the handle and returns the first failure
 *   among them (a short read or write is a failure, never a count: a read past the end of a
 *   file is ZINF_E_OUT_OF_RANGE); *completed (optional) receives how many were queued since the
 *   last wait. A file first used while transfers are in flight waits for them first.
 * - zinf_io_sync_pread / zinf_io_sync_pwrite: the same, waited for.
 *
 * Pinned buffers: zinf_pinned_alloc returns page-aligned memory locked in RAM (mlock; the
 *   failure names RLIMIT_MEMLOCK when the limit refuses it); zinf_pinned_free releases it.
 *
 * CPU Adam (zinf's SIMD kernel; DeepSpeed's DeepSpeedCPUAdam parameters): zinf_adam_step
 *   updates n fp32 parameters and their fp32 moments in place from gradients in fp32, bf16 or
 *   fp16, with Adam or AdamW (params.adamw), bias correction optional, and writes the new
 *   weights' bf16 or fp16 copy when param16_out is not NULL (one pass over memory).
 *
 * Thread-safety: zinf_version, zinf_strerror, zinf_last_error, zinf_pinned_* and zinf_adam_step
 * on distinct zinf_adam handles may be called from any thread. One zinf_io handle is used by one
 * thread at a time (the caller serializes); distinct handles are independent. A zinf_adam
 * handle may step from several threads at once (it holds no per-step state).
 */
#ifndef ZINF_ZINF_H_
#define ZINF_ZINF_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(ZINF_BUILDING_LIBRARY)
#define ZINF_API __attribute__((visibility("default")))
#else
#define ZINF_API
#endif

#define ZINF_VERSION_MAJOR 0
#define ZINF_VERSION_MINOR 1
#define ZINF_VERSION_PATCH 0
/* major * 10000 + minor * 100 + patch */
#define ZINF_VERSION_NUMBER (ZINF_VERSION_MAJOR * 10000 + ZINF_VERSION_MINOR * 100 + ZINF_VERSION_PATCH)

/* Status codes. */
#define ZINF_OK 0
#define ZINF_E_INVALID_ARGUMENT -1
#define ZINF_E_NOT_FOUND -2
#define ZINF_E_ALREADY_EXISTS -3
#define ZINF_E_PERMISSION_DENIED -4
#define ZINF_E_RESOURCE_EXHAUSTED -5
#define ZINF_E_FAILED_PRECONDITION -6
#define ZINF_E_OUT_OF_RANGE -7
#define ZINF_E_UNIMPLEMENTED -8
#define ZINF_E_UNAVAILABLE -9
#define ZINF_E_IO -10
#define ZINF_E_DATA_LOSS -11
#define ZINF_E_ABORTED -12
#define ZINF_E_INTERNAL -13

/* Element types. */
#define ZINF_DTYPE_F32 0
#define ZINF_DTYPE_BF16 1
#define ZINF_DTYPE_F16 2

/* "0.1.0" */
ZINF_API const char* zinf_version(void);
/* ZINF_VERSION_NUMBER of the library loaded (compare with the header's). */
ZINF_API int zinf_version_number(void);
/* "ok", "invalid argument", ... ("unknown status" for a code zinf does not return). */
ZINF_API const char* zinf_strerror(int status);
/* The calling thread's message of its last failed call ("" when none failed). */
ZINF_API const char* zinf_last_error(void);

/* ---- pinned buffers ---------------------------------------------------------------------- */
ZINF_API int zinf_pinned_alloc(uint64_t bytes, void** out);
ZINF_API int zinf_pinned_free(void* ptr);

/* ---- file I/O ------------------------------------------------------------------------------ */
typedef struct zinf_io zinf_io;

typedef struct zinf_io_params {
  uint64_t size;          /* sizeof(zinf_io_params) */
  uint64_t block_size;    /* the largest piece handed to the kernel (bytes); 0: 1 MiB */
  uint32_t queue_depth;   /* pieces in flight at once; 0: 32 */
  uint32_t direct;        /* 1: O_DIRECT (aligned transfers), 0: buffered */
  const char* engine;     /* "auto", "uring", "aio" or "posix"; NULL: "auto" */
} zinf_io_params;

#define ZINF_IO_PARAMS_INIT {sizeof(zinf_io_params), 0, 0, 1, NULL}

ZINF_API int zinf_io_open(const zinf_io_params* params, zinf_io** out);
/* Waits for the transfers in flight (their errors are dropped: wait first to see them). */
ZINF_API int zinf_io_close(zinf_io* io);
ZINF_API int zinf_io_pread(zinf_io* io, void* buf, uint64_t bytes, const char* path,
                           uint64_t offset);
ZINF_API int zinf_io_pwrite(zinf_io* io, const void* buf, uint64_t bytes, const char* path,
                            uint64_t offset);
ZINF_API int zinf_io_wait(zinf_io* io, uint64_t* completed);
ZINF_API int zinf_io_sync_pread(zinf_io* io, void* buf, uint64_t bytes, const char* path,
                                uint64_t offset);
ZINF_API int zinf_io_sync_pwrite(zinf_io* io, const void* buf, uint64_t bytes,
                                 const char* path, uint64_t offset);
/* The engine the handle runs ("uring", "aio" or "posix"). */
ZINF_API const char* zinf_io_engine(const zinf_io* io);

/* ---- CPU Adam ------------------------------------------------------------------------------ */
typedef struct zinf_adam zinf_adam;

typedef struct zinf_adam_params {
  uint64_t size;            /* sizeof(zinf_adam_params) */
  float lr;                 /* used when zinf_adam_step's lr is negative */
  float beta1, beta2, eps;
  float weight_decay;
  uint32_t adamw;           /* 1: decoupled weight decay (AdamW), 0: L2 (Adam) */
  uint32_t bias_correction; /* 1: PyTorch's bias correction */
  uint32_t threads;         /* worker threads per step; 0: every core, 1: the caller's only */
} zinf_adam_params;

#define ZINF_ADAM_PARAMS_INIT {sizeof(zinf_adam_params), 1e-3f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, 1, 0}

ZINF_API int zinf_adam_create(const zinf_adam_params* params, zinf_adam** out);
ZINF_API int zinf_adam_destroy(zinf_adam* adam);
/* One step (step: 1-based, PyTorch's state['step'] after its increment; lr < 0: params.lr). */
ZINF_API int zinf_adam_step(zinf_adam* adam, int64_t step, float lr, float* param,
                            const void* grad, int grad_dtype, float* exp_avg, float* exp_avg_sq,
                            uint64_t n, void* param16_out, int param16_dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZINF_ZINF_H_ */
