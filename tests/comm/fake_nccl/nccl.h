// tests/comm/fake_nccl/nccl.h — the part of NCCL's API the NCCL transport uses, faked on the
// host (fake_nccl.cc) over its fake streams: communicators of ranks that are threads of one
// process, point-to-point transfers matched in order per pair of ranks (a byte stream: a receive
// of another size than its send takes a prefix, or waits), the three collectives.
// Renamed to zinf_fake_* as cuda_runtime.h's functions are.
//
// Like NCCL 2.28's non-blocking communicators (config.blocking = 0): the set-up stays in
// progress until every rank has joined; every other group end returns ncclInProgress, and the
// call is started by a later ncclCommGetAsyncError (which first answers ncclInProgress once).
// A call on a communicator that is still starting one is refused with ncclInvalidUsage and
// recorded as a breach, as NCCL refuses it. ncclCommAbort ends the waits of its own work; a
// peer's waits go on (a silent rank), as with NCCL; any call on an aborted communicator is a
// breach (NCCL freed it). Not modelled: a first transfer toward a peer that stays starting until
// the peer joins in (NCCL connects lazily), asynchronous errors.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t { ncclUint8 = 1, ncclFloat32 = 7 };
enum ncclRedOp_t { ncclSum = 0 };
struct zinf_fake_comm;
typedef zinf_fake_comm* ncclComm_t;
struct ncclUniqueId {
  char internal[128];
};
struct ncclConfig_t {
  int blocking;
};
#define NCCL_CONFIG_INITIALIZER {1}

#define ncclGetVersion zinf_fake_ncclGetVersion
#define ncclGetErrorString zinf_fake_ncclGetErrorString
#define ncclGetLastError zinf_fake_ncclGetLastError
#define ncclGetUniqueId zinf_fake_ncclGetUniqueId
#define ncclCommInitRankConfig zinf_fake_ncclCommInitRankConfig
#define ncclCommGetAsyncError zinf_fake_ncclCommGetAsyncError
#define ncclCommFinalize zinf_fake_ncclCommFinalize
#define ncclCommDestroy zinf_fake_ncclCommDestroy
#define ncclCommAbort zinf_fake_ncclCommAbort
#define ncclGroupStart zinf_fake_ncclGroupStart
#define ncclGroupEnd zinf_fake_ncclGroupEnd
#define ncclSend zinf_fake_ncclSend
#define ncclRecv zinf_fake_ncclRecv
#define ncclAllReduce zinf_fake_ncclAllReduce
#define ncclAllGather zinf_fake_ncclAllGather
#define ncclReduceScatter zinf_fake_ncclReduceScatter

ncclResult_t ncclGetVersion(int* version);
const char* ncclGetErrorString(ncclResult_t r);
const char* ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* state);
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s);
ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s);
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s);
