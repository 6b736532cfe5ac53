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
 * The engine (zinf_engine): tensors the caller registers, each with a home (pinned host memory
 *   or NVMe), paged into the host tier (pinned slots) and the device tier (the device budget)
 *   on demand, under the hard budgets of the JSON config (zinf train's keys: zinf.budgets,
 *   aio, zinf.swap_dir / zinf.stripe_paths / an offload nvme_path, zinf.prefetch_depth).
 * - Register every tensor first. The first zinf_engine_seal, acquire, read or write plans the
 *   memory once: every tier's slots hold the leases the params declare per tier and role, or
 *   the seal is refused with the numbers; a sealed engine never fails later for lack of
 *   memory. Registering after it is refused.
 * - zinf_acquire returns a lease at once (the transfer runs in the background);
 *   zinf_lease_wait blocks until the data is in that tier and gives its address (valid until
 *   zinf_release). zinf_release(dirty = 1) means the caller modified the copy: it is written
 *   home before its memory is reused, and the other tier's copy is dropped. Leasing more than
 *   the params declared fails (ZINF_E_FAILED_PRECONDITION), as does releasing a lease twice
 *   (ZINF_E_NOT_FOUND); an acquire that could only wait for the caller's own leases fails with
 *   ZINF_E_RESOURCE_EXHAUSTED instead of hanging. Device-tier leases: finish the work that uses
 *   the copy (synchronize your stream) before releasing it.
 * - Prefetch: the acquires up to the first zinf_engine_end_step are the trace; in later steps
 *   each acquire that follows it fetches the next tensors ahead (as far as zinf.prefetch_depth
 *   units and the budgets allow), and eviction keeps what is needed soonest (Belady). Pause
 *   the trace around work outside the loop's order (an evaluation pass).
 * - zinf_engine_adam_step steps registered fp32 weights and moments with a zinf_adam: it
 *   leases them in the host tier (NVMe homes are read ahead by the trace, written back
 *   behind), runs the SIMD step and releases them modified.
 * - zinf_engine_flush writes every modified copy home; zinf_engine_close does NOT (flush
 *   first): it waits for transfers in flight, drops the leases still held and deletes the swap
 *   file.
 * - zinf_engine_stats: bytes per link, busy and stall seconds, prefetch hits, evictions, peak
 *   bytes per tier, as one JSON object.
 *
 * Thread-safety: zinf_version, zinf_strerror, zinf_last_error, zinf_pinned_*, zinf_adam_step
 * and zinf_adam_step_many on distinct zinf_adam handles may be called from any thread. One zinf_io handle is used by one
 * thread at a time (the caller serializes); distinct handles are independent. A zinf_adam
 * handle may step from several threads at once (it holds no per-step state). Every zinf_engine
 * call may come from any thread; one lease is used by one thread at a time (a wait and a
 * release of the same lease from two threads are serialized, not an error).
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

/* XXH64 with seed 0 of `bytes` bytes at `data` (NULL only with 0 bytes, else 0 is returned):
   the hash zinf's checkpoints record for each shard. Any thread. */
ZINF_API uint64_t zinf_xxh64(const void* data, uint64_t bytes);

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

/* Many tensors in one step (a framework's parameter group: weights, biases, norms): one
   dispatch over all their elements, so a few threads share many small tensors, each tensor bit
   for bit what zinf_adam_step gives it. Each carries its own step; lr (< 0: params.lr) is the
   group's. Fields as zinf_adam_step's arguments; size = sizeof(zinf_adam_tensor), the same in
   every element (the array's stride). An error names the tensor's index and steps none. */
typedef struct zinf_adam_tensor {
  uint64_t size;            /* sizeof(zinf_adam_tensor) */
  int64_t step;             /* 1-based */
  float* param;
  const void* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* param16_out;        /* NULL: no 16-bit copy */
  uint64_t n;
  int32_t grad_dtype;       /* ZINF_DTYPE_F32, _BF16 or _F16 */
  int32_t param16_dtype;    /* ZINF_DTYPE_BF16 or _F16, when param16_out is set */
} zinf_adam_tensor;

ZINF_API int zinf_adam_step_many(zinf_adam* adam, float lr, const zinf_adam_tensor* tensors,
                                 uint64_t count);

/* ---- the engine: registered tensors paged between device, pinned memory and NVMe ---------- */
typedef struct zinf_engine zinf_engine;

#define ZINF_TIER_DEVICE 0
#define ZINF_TIER_HOST 1
#define ZINF_TIER_NVME 2

/* Roles: what a tensor holds (for budgets per role and the statistics). */
#define ZINF_ROLE_PARAM 0      /* working weights */
#define ZINF_ROLE_MASTER 1     /* fp32 master weights */
#define ZINF_ROLE_EXP_AVG 2    /* Adam's first moment */
#define ZINF_ROLE_EXP_AVG_SQ 3 /* Adam's second moment */
#define ZINF_ROLE_GRAD 4       /* gradients */
#define ZINF_ROLES 5

/* Acquire modes. OVERWRITE (host tier only): the caller writes all of it, so an absent copy is
   not read from its home (its content is undefined until written); release it dirty.
   UNTRACED: a read outside the step's order (neither recorded nor matched by the prefetcher). */
#define ZINF_ACQUIRE_READ 0
#define ZINF_ACQUIRE_OVERWRITE 1
#define ZINF_ACQUIRE_UNTRACED 2

#define ZINF_NO_TENSOR UINT64_MAX

typedef struct zinf_engine_params {
  uint64_t size;            /* sizeof(zinf_engine_params) */
  const char* config_path;  /* a JSON file with zinf train's keys; NULL: config_json */
  const char* config_json;  /* the JSON text; both NULL: the defaults */
  /* Leases held at once in each tier, per role, by every thread together (the memory plan);
     0: the role is never leased in that tier. */
  uint32_t device_leases[ZINF_ROLES];
  uint32_t host_leases[ZINF_ROLES];
  const char* device;       /* "auto" (a GPU when one answers), "host" or "cuda"; NULL: "auto" */
} zinf_engine_params;

#define ZINF_ENGINE_PARAMS_INIT \
  {sizeof(zinf_engine_params), NULL, NULL, {4, 0, 0, 0, 4}, {4, 4, 4, 4, 4}, NULL}

typedef struct zinf_tensor_spec {
  uint64_t size;     /* sizeof(zinf_tensor_spec) */
  const char* name;  /* for messages and traces; NULL: "tensor<id>" */
  uint64_t bytes;    /* > 0 */
  int role;          /* ZINF_ROLE_* */
  int home;          /* ZINF_TIER_HOST (pinned memory) or ZINF_TIER_NVME */
  uint32_t unit;     /* the group it is used with (a layer): prefetch reaches whole units ahead */
} zinf_tensor_spec;

#define ZINF_TENSOR_SPEC_INIT \
  {sizeof(zinf_tensor_spec), NULL, 0, ZINF_ROLE_PARAM, ZINF_TIER_NVME, 0}

ZINF_API int zinf_engine_open(const zinf_engine_params* params, zinf_engine** out);
ZINF_API int zinf_engine_close(zinf_engine* engine);
/* *id: the tensor's handle (0, 1, 2, ... in registration order). */
ZINF_API int zinf_tensor_register(zinf_engine* engine, const zinf_tensor_spec* spec,
                                  uint64_t* id);
/* Plans the memory (see the contract); optional: the first use does it. */
ZINF_API int zinf_engine_seal(zinf_engine* engine);
/* Sets the tensor's content (spec.bytes from src) at its home; no lease may be held on it. */
ZINF_API int zinf_tensor_write(zinf_engine* engine, uint64_t id, const void* src);
/* Reads its newest content (modified copies included: they are flushed first) into dst. */
ZINF_API int zinf_tensor_read(zinf_engine* engine, uint64_t id, void* dst);
/* Drops every copy without writing it home (a consumed gradient); no lease may be held. */
ZINF_API int zinf_tensor_discard(zinf_engine* engine, uint64_t id);
ZINF_API int zinf_acquire(zinf_engine* engine, uint64_t id, int tier, int mode, uint64_t* lease);
ZINF_API int zinf_lease_wait(zinf_engine* engine, uint64_t lease, void** ptr);
ZINF_API int zinf_release(zinf_engine* engine, uint64_t lease, int dirty);
/* The end of one step of the caller's loop (the first ends the trace the prefetcher follows). */
ZINF_API int zinf_engine_end_step(zinf_engine* engine);
/* paused != 0: acquires are neither recorded nor matched until resumed. */
ZINF_API int zinf_engine_pause_trace(zinf_engine* engine, int paused);
ZINF_API int zinf_engine_flush(zinf_engine* engine);
/* *json: the statistics as a JSON object, valid until this thread's next zinf call. */
ZINF_API int zinf_engine_stats(zinf_engine* engine, const char** json);
/* One Adam step over registered tensors: param (fp32, ZINF_ROLE_MASTER or _PARAM), exp_avg and
   exp_avg_sq (fp32, as many bytes), grad (n = param bytes / 4 elements of grad_dtype, caller's
   memory), and param16 (optional, ZINF_NO_TENSOR: none) receiving the new weights in
   param16_dtype. step and lr as zinf_adam_step. */
ZINF_API int zinf_engine_adam_step(zinf_engine* engine, zinf_adam* adam, int64_t step, float lr,
                                   uint64_t param, const void* grad, int grad_dtype,
                                   uint64_t exp_avg, uint64_t exp_avg_sq, uint64_t param16,
                                   int param16_dtype);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZINF_ZINF_H_ */
