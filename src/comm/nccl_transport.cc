// NcclTransport's steps: staging, NCCL's grouped sends and receives, completion, failure.
#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "src/comm/nccl_transport_impl.h"

namespace zinf::comm {
ZINF_NCCL_BUILD_BEGIN
namespace nccl_detail {

NcclTransport::NcclTransport(std::unique_ptr<Transport> rendezvous, std::span<const int> members,
                             int ordinal, Ms timeout, size_t staging_cap)
    : rdv_(std::move(rendezvous)),
      members_(members.begin(), members.end()),
      ordinal_(ordinal),
      timeout_(timeout),
      rank_(rdv_->rank()),
      world_(rdv_->world()),
      staging_cap_(staging_cap) {}

std::string NcclTransport::Who() const { return fmt::format("rank {}", Global(rank_)); }

std::string NcclTransport::Names(const std::vector<int>& peers) const {
  std::string s;
  for (int p : peers) s += (s.empty() ? "rank " : ", rank ") + std::to_string(Global(p));
  return s.empty() ? "no peer" : s;
}

std::vector<int> NcclTransport::Everyone() const {
  std::vector<int> v;
  for (int r = 0; r < world_; ++r)
    if (r != rank_) v.push_back(r);
  return v;
}

Status NcclTransport::CudaError(cudaError_t e, const std::string& what) const {
  return Status(StatusCode::kUnavailable,
                fmt::format("{} (GPU {}): {}: {} ({})", Who(), ordinal_, what,
                            cudaGetErrorString(e), cudaGetErrorName(e)));
}

Status NcclTransport::NcclError(ncclResult_t r, const std::string& what) const {
  const char* last = ncclGetLastError(comm_);
  return Status(r == ncclRemoteError || r == ncclSystemError ? StatusCode::kUnavailable
                                                             : StatusCode::kInternal,
                fmt::format("{} (GPU {}): {}: {}{}{}", Who(), ordinal_, what,
                            ncclGetErrorString(r), last && *last ? ": " : "", last ? last : ""));
}

Status NcclTransport::Enter(const DeviceScope& device) {
  if (!failed_.ok()) return failed_;
  if (device.status() != cudaSuccess) return Fail(CudaError(device.status(), "cudaSetDevice"));
  return Status::Ok();
}

void NcclTransport::Abort() {
  if (comm_ != nullptr && !aborted_) ncclCommAbort(comm_);
  aborted_ = true;
}

Status NcclTransport::Fail(Status s) {
  if (failed_.ok()) failed_ = std::move(s);
  Abort();
  return failed_;
}

Result<bool> NcclTransport::Started() const {
  ncclResult_t state = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
  if (r != ncclSuccess) return NcclError(r, "ncclCommGetAsyncError");
  if (state == ncclSuccess) return true;
  if (state == ncclInProgress) return false;
  return NcclError(state, "NCCL");
}

Result<bool> NcclTransport::Reached(cudaEvent_t e) const {
  const cudaError_t q = cudaEventQuery(e);
  if (q == cudaSuccess) return true;
  if (q != cudaErrorNotReady) return CudaError(q, "cudaEventQuery");
  Result<bool> started = Started();  // NCCL's asynchronous error, if any
  if (!started.ok()) return started.status();
  return false;
}

Status NcclTransport::GonePeer(const std::vector<int>& peers, const char* what,
                               Clock::time_point deadline) {
  for (int p : peers) {
    if (Clock::now() >= deadline) break;  // a store slow to answer does not stretch the wait
    Result<bool> gone = rdv_->PeerGone(p);
    if (!gone.ok()) {
      return Status(StatusCode::kUnavailable,
                    fmt::format("{}: the rendezvous store (rank {}'s) cannot be reached while {} "
                                "(rank {} exited or died?): {}",
                                Who(), Global(0), what, Global(0), gone.status().message()));
    }
    if (*gone) {
      return Status(StatusCode::kUnavailable,
                    fmt::format("{}: rank {} exited or died (its store connection closed) while "
                                "{}; NCCL's communicator aborted",
                                Who(), Global(p), what));
    }
  }
  return Status::Ok();
}

Status NcclTransport::Until(Clock::time_point deadline, Ms timeout,
                            const std::vector<int>& peers, const char* what,
                            const std::function<Result<bool>()>& ready) {
  const auto start = Clock::now();
  auto next_check = start + std::chrono::seconds(1);
  for (;;) {
    Result<bool> r = ready();
    if (!r.ok()) {
      // A dead peer often shows first as NCCL's remote or system error: name it when the store
      // can.
      Status gone = GonePeer(peers, what, deadline);
      if (gone.ok()) return Fail(r.status());
      return Fail(Status(gone.code(), gone.message() + "; NCCL said: " + r.status().message()));
    }
    if (*r) return Status::Ok();
    const auto now = Clock::now();
    if (now >= deadline) {
      return Fail(Aborted(fmt::format(
          "{}: no answer from {} within {} s while {} (stuck, dead, or issuing other "
          "collectives?); NCCL's communicator aborted",
          Who(), Names(peers), double(timeout.count()) / 1000.0, what)));
    }
    if (now >= next_check) {
      Status gone = GonePeer(peers, what, deadline);
      if (!gone.ok()) {
        // A peer that finished its part and exited is not a failure: what it sent is here.
        std::this_thread::sleep_for(Ms(100));
        Result<bool> late = ready();
        if (late.ok() && *late) return Status::Ok();
        return Fail(gone);
      }
      next_check = Clock::now() + std::chrono::seconds(1);
    }
    // Spin briefly (a small step ends in microseconds), then poll less often: a waiting rank
    // must not take a core from NCCL's own threads.
    const auto waited = now - start;
    if (waited < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else if (waited < Ms(5)) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
}

Result<cudaEvent_t> NcclTransport::TakeEvent() {
  if (!free_events_.empty()) {
    cudaEvent_t e = free_events_.back();
    free_events_.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  const cudaError_t r = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (r != cudaSuccess) return Fail(CudaError(r, "cudaEventCreateWithFlags"));
  events_.push_back(e);
  return e;
}

Result<int> NcclTransport::TakePinned(size_t bytes) {
  size_t size = size_t{1} << 20;
  while (size < bytes) size *= 2;
  for (;;) {
    int best = -1;
    for (size_t i = 0; i < pinned_.size(); ++i) {
      const PinnedBlock& b = pinned_[i];
      if (!b.used && b.bytes >= bytes && (best < 0 || b.bytes < pinned_[size_t(best)].bytes))
        best = int(i);
    }
    if (best >= 0) {
      pinned_[size_t(best)].used = true;
      return best;
    }
    if (pinned_total_ + size <= staging_cap_) break;
    ZINF_ASSIGN_OR_RETURN(bool retired, RetireOldest());
    if (!retired) {
      // Nothing in flight, so nothing writes the blocks: give them back before a larger one.
      for (PinnedBlock& b : pinned_) cudaFreeHost(b.p);
      pinned_.clear();
      pinned_total_ = 0;
      break;
    }
  }
  void* p = nullptr;
  const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocDefault);
  if (e != cudaSuccess)
    return Fail(CudaError(e, fmt::format("cudaHostAlloc of {} bytes of staging", size)));
  pinned_.push_back({static_cast<char*>(p), size, true});
  pinned_total_ += size;
  return int(pinned_.size() - 1);
}

void NcclTransport::Release(Step& s) {
  if (s.pinned >= 0) pinned_[size_t(s.pinned)].used = false;
  if (s.done != nullptr) free_events_.push_back(s.done);
  s.pinned = -1;
  s.done = nullptr;
}

Status NcclTransport::QueueTail(Step& s) {
  char* host = pinned_[size_t(s.pinned)].p;
  char* dev = static_cast<char*>(s.dev);
  cudaError_t e = cudaSuccess;
  if (s.recv_bytes > 0)
    e = cudaMemcpyAsync(host + s.send_bytes, dev + s.send_bytes, s.recv_bytes,
                        cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaFreeAsync(s.dev, stream_);
  if (e == cudaSuccess) e = cudaEventRecord(s.done, stream_);
  if (e != cudaSuccess) return Fail(CudaError(e, "queueing a step's copy back"));
  s.dev = nullptr;
  s.launched = true;
  return Status::Ok();
}

Status NcclTransport::FinishLaunching(Clock::time_point deadline, Ms timeout) {
  if (!has_launching_) return Status::Ok();
  Step& s = steps_.at(launching_);
  ZINF_RETURN_IF_ERROR(
      Until(deadline, timeout, s.peers, "starting a transfer", [this] { return Started(); }));
  has_launching_ = false;
  return QueueTail(s);
}

Status NcclTransport::Complete(Step& s, Clock::time_point deadline, Ms timeout) {
  if (s.finished) return Status::Ok();
  if (!s.launched) ZINF_RETURN_IF_ERROR(FinishLaunching(deadline, timeout));
  ZINF_RETURN_IF_ERROR(Until(deadline, timeout, s.peers, "moving a step's data",
                             [this, &s] { return Reached(s.done); }));
  const char* host = pinned_[size_t(s.pinned)].p;
  size_t off = s.send_bytes;
  for (const RecvOp& r : s.recvs) {
    uint64_t header[2] = {0, 0};  // tag, bytes
    std::memcpy(header, host + off, kHeader);
    if (header[0] != s.tag || header[1] != r.bytes) {
      return Fail(Internal(fmt::format(
          "{}: rank {} sent step {} ({} bytes) where this rank expected step {} ({} bytes): the "
          "ranks issued different collectives (zinf.comm.check_sequence names them) or posted "
          "their steps in different orders (NCCL matches transfers by order)",
          Who(), Global(r.peer), header[0], header[1], s.tag, r.bytes)));
    }
    std::memcpy(r.data, host + off + kHeader, r.bytes);
    off += Slot(r.bytes);
  }
  Release(s);
  s.finished = true;
  return Status::Ok();
}

Result<bool> NcclTransport::RetireOldest() {
  while (!order_.empty()) {
    const uint64_t tag = order_.front();
    order_.pop_front();
    auto it = steps_.find(tag);
    if (it == steps_.end() || it->second.finished) continue;
    ZINF_RETURN_IF_ERROR(Complete(it->second, Clock::now() + timeout_, timeout_));
    return true;
  }
  return false;
}

Status NcclTransport::Post(uint64_t tag, std::span<const SendOp> sends,
                           std::span<const RecvOp> recvs) {
  DeviceScope device(ordinal_);
  ZINF_RETURN_IF_ERROR(Enter(device));
  if (steps_.count(tag) != 0)
    return Fail(Internal(fmt::format("{}: tag {} posted twice", Who(), tag)));
  // NCCL's non-blocking mode: no call on the communicator, and nothing queued on its stream,
  // before the last call has started.
  ZINF_RETURN_IF_ERROR(FinishLaunching(Clock::now() + timeout_, timeout_));
  Step st;
  st.tag = tag;
  auto add_peer = [&st](int p) {
    if (std::find(st.peers.begin(), st.peers.end(), p) == st.peers.end()) st.peers.push_back(p);
  };
  std::vector<const SendOp*> live_sends;
  for (const SendOp& s : sends) {
    if (s.bytes == 0) continue;
    st.send_bytes += Slot(s.bytes);
    live_sends.push_back(&s);
    add_peer(s.peer);
  }
  for (const RecvOp& r : recvs) {
    if (r.bytes == 0) continue;
    st.recv_bytes += Slot(r.bytes);
    st.recvs.push_back(r);
    add_peer(r.peer);
  }
  const size_t total = st.send_bytes + st.recv_bytes;
  if (total == 0) {
    st.launched = st.finished = true;
    steps_.emplace(tag, std::move(st));
    return Status::Ok();
  }
  ZINF_ASSIGN_OR_RETURN(st.pinned, TakePinned(total));
  ZINF_ASSIGN_OR_RETURN(st.done, TakeEvent());
  char* host = pinned_[size_t(st.pinned)].p;
  size_t off = 0;
  for (const SendOp* s : live_sends) {
    const uint64_t header[2] = {tag, s->bytes};
    std::memcpy(host + off, header, kHeader);
    std::memcpy(host + off + kHeader, s->data, s->bytes);
    off += Slot(s->bytes);
  }
  cudaError_t e = cudaMallocAsync(&st.dev, total, stream_);
  if (e == cudaSuccess && st.send_bytes > 0)
    e = cudaMemcpyAsync(st.dev, host, st.send_bytes, cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) return Fail(CudaError(e, fmt::format("staging a step of {} bytes", total)));
  char* dev = static_cast<char*>(st.dev);
  ncclResult_t first = ncclGroupStart();
  off = 0;
  for (const SendOp* s : live_sends) {
    if (first != ncclSuccess) break;
    first = ncclSend(dev + off, s->bytes + kHeader, ncclUint8, s->peer, comm_, stream_);
    off += Slot(s->bytes);
  }
  off = st.send_bytes;
  for (const RecvOp& r : st.recvs) {
    if (first != ncclSuccess) break;
    first = ncclRecv(dev + off, r.bytes + kHeader, ncclUint8, r.peer, comm_, stream_);
    off += Slot(r.bytes);
  }
  // Always ended: NCCL's group depth is per thread, and other communicators share this thread.
  const ncclResult_t end = ncclGroupEnd();
  Step& placed = steps_.emplace(tag, std::move(st)).first->second;
  order_.push_back(tag);
  if (first != ncclSuccess) return Fail(NcclError(first, "posting a send or receive"));
  if (end == ncclInProgress) {
    has_launching_ = true;
    launching_ = tag;
    return Status::Ok();
  }
  if (end != ncclSuccess) return Fail(NcclError(end, "ncclGroupEnd"));
  return QueueTail(placed);
}

Status NcclTransport::Wait(uint64_t tag, Ms timeout) {
  if (!failed_.ok()) return failed_;
  auto it = steps_.find(tag);
  if (it == steps_.end()) return Status::Ok();
  DeviceScope device(ordinal_);
  ZINF_RETURN_IF_ERROR(Enter(device));
  ZINF_RETURN_IF_ERROR(Complete(it->second, Clock::now() + timeout, timeout));
  steps_.erase(it);
  order_.erase(std::remove(order_.begin(), order_.end(), tag), order_.end());
  return Status::Ok();
}

// Nothing lands in the caller's buffers after this: only Wait and a retirement copy into them.
void NcclTransport::Cancel() {
  DeviceScope device(ordinal_);
  Abort();
  steps_.clear();
  order_.clear();
  has_launching_ = false;
}

NcclTransport::~NcclTransport() {
  DeviceScope device(ordinal_);
  if (device.status() != cudaSuccess) return;
  if (!aborted_ && comm_ != nullptr && !steps_.empty()) Abort();
  if (!aborted_ && comm_ != nullptr) {
    const ncclResult_t r = ncclCommFinalize(comm_);
    if (r == ncclSuccess || r == ncclInProgress) {
      (void)Until(Clock::now() + timeout_, timeout_, Everyone(), "closing NCCL's communicator",
                  [this] { return Started(); });
    } else {
      Abort();
    }
  }
  if (comm_ != nullptr && !aborted_) ncclCommDestroy(comm_);
  if (stream_ != nullptr && !aborted_) cudaStreamSynchronize(stream_);
  // A stream or an event with work still queued may be destroyed: CUDA releases it once the
  // work is done.
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  if (aborted_) return;  // the staging may still be written by copies queued behind the abort
  for (PinnedBlock& b : pinned_) cudaFreeHost(b.p);
}

}  // namespace nccl_detail
ZINF_NCCL_BUILD_END
}  // namespace zinf::comm
