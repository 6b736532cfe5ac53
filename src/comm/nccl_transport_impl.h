// src/comm/nccl_transport_impl.h — NcclTransport's class, shared by its two files: the steps and
// their staging (nccl_transport.cc), and the set-up, NCCL's own collectives and the version
// (nccl_setup.cc). Internal to zinf_comm in builds with NCCL; the contract is nccl_transport.h's.
//
// Thread-safety: as nccl_transport.h (one thread at a time).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "src/comm/nccl_transport.h"

namespace zinf::comm {
ZINF_NCCL_BUILD_BEGIN
namespace nccl_detail {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Each transfer's place in the staging starts on a 256-byte boundary (what cudaMalloc gives) and
// holds a 16-byte header, the step's tag and the sender's byte count (the receiver checks both
// against its own: NCCL matches transfers by order, not by tag), then the payload.
inline constexpr size_t kAlign = 256;
inline constexpr size_t kHeader = 16;
inline size_t Up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
inline size_t Slot(size_t bytes) { return Up(bytes + kHeader); }

// Makes a GPU current on the calling thread for one call, and gives the thread its own back
// after it (the communicator may run a step on its caller's thread).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = cudaSetDevice(ordinal);
  }
  ~DeviceScope() {
    if (previous_ >= 0) cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class NcclTransport final : public Transport {
 public:
  NcclTransport(std::unique_ptr<Transport> rendezvous, std::span<const int> members, int ordinal,
                Ms timeout, size_t staging_cap);
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string Describe() const override { return describe_; }
  Status Post(uint64_t tag, std::span<const SendOp> sends,
              std::span<const RecvOp> recvs) override;
  Status Wait(uint64_t tag, Ms timeout) override;
  void Cancel() override;
  Result<bool> PeerGone(int peer) override { return rdv_->PeerGone(peer); }
  bool MatchesInPostOrder() const override { return true; }

  // The hello to rank 0, NCCL's id back, the communicator and the stream (nccl_setup.cc).
  Status Start();
  // One of NCCL's collectives (NcclRaw): `in` staged to the GPU, op(device in, device out) run,
  // `out_bytes` copied back to `out` (in place: the output is the input's place). No step may be
  // in flight.
  Status RunRaw(const char* what, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                bool in_place, const std::function<ncclResult_t(char*, char*)>& op);
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Step {
    uint64_t tag = 0;
    std::vector<RecvOp> recvs;  // the caller's buffers
    std::vector<int> peers;
    size_t send_bytes = 0, recv_bytes = 0;  // staging: the sends' slots, then the receives'
    int pinned = -1;                         // index in pinned_
    void* dev = nullptr;
    cudaEvent_t done = nullptr;
    bool launched = false;  // the group ended; the copy back and the event are queued
    bool finished = false;  // its receives are in the caller's buffers
  };
  struct PinnedBlock {
    char* p = nullptr;
    size_t bytes = 0;
    bool used = false;
  };

  int Global(int r) const { return members_.empty() ? r : members_[static_cast<size_t>(r)]; }
  std::string Who() const;
  std::string Names(const std::vector<int>& peers) const;
  std::vector<int> Everyone() const;
  Status CudaError(cudaError_t e, const std::string& what) const;
  Status NcclError(ncclResult_t r, const std::string& what) const;
  // The first failure, or the scope's cudaSetDevice error (recorded as a failure).
  Status Enter(const DeviceScope& device);
  // Records the first failure and aborts the communicator; returns the first failure.
  Status Fail(Status s);
  void Abort();
  // true when no NCCL call of the communicator is still starting; its error otherwise.
  Result<bool> Started() const;
  // true when the stream has passed `e`; NCCL's or CUDA's error otherwise.
  Result<bool> Reached(cudaEvent_t e) const;
  // Asks the store whether one of `peers` ended (until the deadline): Unavailable naming it, or
  // naming the store when it cannot be reached; Ok when none did.
  Status GonePeer(const std::vector<int>& peers, const char* what,
                  Clock::time_point deadline);
  // Polls ready() until true, the deadline, an error, or a peer gone.
  Status Until(Clock::time_point deadline, Ms timeout, const std::vector<int>& peers,
               const char* what, const std::function<Result<bool>()>& ready);
  Status FinishLaunching(Clock::time_point deadline, Ms timeout);
  Status QueueTail(Step& s);
  // Waits for a step's data and copies its receives out (checking each header).
  Status Complete(Step& s, Clock::time_point deadline, Ms timeout);
  // Completes the oldest step in flight; false when none is.
  Result<bool> RetireOldest();
  Result<int> TakePinned(size_t bytes);
  Result<cudaEvent_t> TakeEvent();
  void Release(Step& s);

  std::unique_ptr<Transport> rdv_;
  std::vector<int> members_;
  int ordinal_;
  Ms timeout_;
  int rank_, world_;
  std::string describe_, bus_id_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  bool aborted_ = false;
  Status failed_;
  std::map<uint64_t, Step> steps_;  // posted, not yet waited for
  std::deque<uint64_t> order_;      // steps not finished, in posting order
  bool has_launching_ = false;      // a step whose group end is still in progress
  uint64_t launching_ = 0;
  // Pinned staging is not grown past staging_cap_ while steps are in flight: a step that would
  // need more first waits for the oldest ones (their receives then land in the callers' buffers
  // early, which the Transport contract allows).
  std::vector<PinnedBlock> pinned_;
  size_t pinned_total_ = 0;
  size_t staging_cap_;
  std::vector<cudaEvent_t> free_events_, events_;
};

}  // namespace nccl_detail
ZINF_NCCL_BUILD_END
}  // namespace zinf::comm
