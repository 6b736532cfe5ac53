#include "src/comm/nccl_transport.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace zinf::comm {
namespace {

using Ms = std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// The two set-up messages' tags on the rendezvous transport (used for nothing else).
constexpr uint64_t kHelloTag = 0x7a696e666e63636cULL;  // "zinfnccl"
constexpr uint64_t kReplyTag = kHelloTag + 1;
// Each transfer's place in the staging starts on a 256-byte boundary (what cudaMalloc gives).
constexpr size_t kAlign = 256;
constexpr size_t kText = 240;

size_t Up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What each rank tells rank 0 before NCCL starts, and rank 0's answer (plain bytes on the wire:
// every rank runs the same build).
struct Hello {
  uint8_t ok = 0;
  char bus_id[32] = {};
  char text[kText] = {};
};
struct Reply {
  uint8_t ok = 0;
  int32_t bad_rank = -1;
  ncclUniqueId id{};
  char text[kText] = {};
};

void CopyText(char* dst, size_t cap, const std::string& s) {
  const size_t n = std::min(cap - 1, s.size());
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(std::unique_ptr<Transport> rendezvous, std::span<const int> members, int ordinal,
                Ms timeout)
      : rdv_(std::move(rendezvous)),
        members_(members.begin(), members.end()),
        ordinal_(ordinal),
        timeout_(timeout),
        rank_(rdv_->rank()),
        world_(rdv_->world()) {}
  ~NcclTransport() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  std::string Describe() const override { return describe_; }
  Status Post(uint64_t tag, std::span<const SendOp> sends,
              std::span<const RecvOp> recvs) override;
  Status Wait(uint64_t tag, Ms timeout) override;
  void Cancel() override;
  Result<bool> PeerGone(int peer) override { return rdv_->PeerGone(peer); }

  // The hello to rank 0, NCCL's id back, the communicator and the stream.
  Status Start();
  // One of NCCL's collectives (NcclRaw): `in` staged to the GPU, op(device in, device out) run,
  // `out_bytes` copied back to `out` (in place: the output is the input's place).
  Status RunRaw(const char* what, const void* in, size_t in_bytes, void* out, size_t out_bytes,
                bool in_place, const std::function<ncclResult_t(char*, char*)>& op);
  ncclComm_t comm() const { return comm_; }
  cudaStream_t stream() const { return stream_; }

 private:
  struct Step {
    std::vector<RecvOp> recvs;  // the caller's buffers, filled by Wait
    std::vector<int> peers;
    size_t send_bytes = 0, recv_bytes = 0;  // staging: sends first, then receives
    int pinned = -1;                         // index in pinned_
    void* dev = nullptr;
    cudaEvent_t done = nullptr;  // null: nothing to move
    bool launched = false;       // the group ended and the copy back and event are queued
  };
  struct PinnedBlock {
    char* p = nullptr;
    size_t bytes = 0;
    bool used = false;
  };

  int Global(int r) const { return members_.empty() ? r : members_[static_cast<size_t>(r)]; }
  std::string Who() const { return fmt::format("rank {}", Global(rank_)); }
  std::string Names(const std::vector<int>& peers) const;
  std::vector<int> Everyone() const;
  Status Use();
  Status CudaError(cudaError_t e, const std::string& what) const;
  Status NcclError(ncclResult_t r, const std::string& what) const;
  // Records the first failure and aborts the communicator; returns the first failure.
  Status Fail(Status s);
  void Abort();
  // true when no NCCL call of the communicator is still starting; its error otherwise.
  Result<bool> Started() const;
  // Polls ready() until true, the deadline, an error, or a peer gone.
  Status Until(Clock::time_point deadline, Ms timeout, const std::vector<int>& peers,
               const char* what, const std::function<Result<bool>()>& ready);
  Status FinishLaunching(Clock::time_point deadline, Ms timeout);
  Status QueueTail(Step& s);
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
  bool has_launching_ = false;      // a step whose group end is still in progress
  uint64_t launching_ = 0;
  std::vector<PinnedBlock> pinned_;
  std::vector<cudaEvent_t> free_events_, events_;
};

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

Status NcclTransport::Use() {
  const cudaError_t e = cudaSetDevice(ordinal_);
  return e == cudaSuccess ? Status::Ok() : Fail(CudaError(e, "cudaSetDevice"));
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

Status NcclTransport::Until(Clock::time_point deadline, Ms timeout,
                            const std::vector<int>& peers, const char* what,
                            const std::function<Result<bool>()>& ready) {
  const auto start = Clock::now();
  auto next_check = start + std::chrono::seconds(1);
  for (;;) {
    Result<bool> r = ready();
    if (!r.ok()) return Fail(r.status());
    if (*r) return Status::Ok();
    const auto now = Clock::now();
    if (now >= deadline) {
      return Fail(Aborted(fmt::format(
          "{}: no answer from {} within {} s while {} (stuck, dead, or issuing other "
          "collectives?); NCCL's communicator aborted",
          Who(), Names(peers), double(timeout.count()) / 1000.0, what)));
    }
    if (now >= next_check) {
      next_check = now + std::chrono::seconds(1);
      for (int p : peers) {
        Result<bool> gone = rdv_->PeerGone(p);
        if (!gone.ok() || !*gone) continue;
        // A peer that finished its part and exited is not a failure: what it sent is here.
        std::this_thread::sleep_for(Ms(100));
        Result<bool> late = ready();
        if (late.ok() && *late) return Status::Ok();
        return Fail(Status(StatusCode::kUnavailable,
                           fmt::format("{}: rank {} exited or died (its store connection closed) "
                                       "while {}; NCCL's communicator aborted",
                                       Who(), Global(p), what)));
      }
    }
    if (now - start < std::chrono::microseconds(100)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }
}

Result<int> NcclTransport::TakePinned(size_t bytes) {
  int best = -1;
  for (size_t i = 0; i < pinned_.size(); ++i) {
    const PinnedBlock& b = pinned_[i];
    if (!b.used && b.bytes >= bytes && (best < 0 || b.bytes < pinned_[size_t(best)].bytes))
      best = int(i);
  }
  if (best < 0) {
    size_t size = size_t{1} << 20;
    while (size < bytes) size *= 2;
    void* p = nullptr;
    const cudaError_t e = cudaHostAlloc(&p, size, cudaHostAllocDefault);
    if (e != cudaSuccess)
      return Fail(CudaError(e, fmt::format("cudaHostAlloc of {} bytes of staging", size)));
    pinned_.push_back({static_cast<char*>(p), size, false});
    best = int(pinned_.size() - 1);
  }
  pinned_[size_t(best)].used = true;
  return best;
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

Status NcclTransport::Post(uint64_t tag, std::span<const SendOp> sends,
                           std::span<const RecvOp> recvs) {
  if (!failed_.ok()) return failed_;
  if (steps_.count(tag) != 0)
    return Fail(Internal(fmt::format("{}: tag {} posted twice", Who(), tag)));
  ZINF_RETURN_IF_ERROR(Use());
  // NCCL's non-blocking mode: no call on the communicator before the last one has started.
  ZINF_RETURN_IF_ERROR(FinishLaunching(Clock::now() + timeout_, timeout_));
  Step st;
  auto add_peer = [&st](int p) {
    if (std::find(st.peers.begin(), st.peers.end(), p) == st.peers.end()) st.peers.push_back(p);
  };
  for (const SendOp& s : sends) {
    if (s.bytes == 0) continue;
    st.send_bytes += Up(s.bytes);
    add_peer(s.peer);
  }
  for (const RecvOp& r : recvs) {
    if (r.bytes == 0) continue;
    st.recv_bytes += Up(r.bytes);
    st.recvs.push_back(r);
    add_peer(r.peer);
  }
  const size_t total = st.send_bytes + st.recv_bytes;
  if (total == 0) {
    st.launched = true;
    steps_.emplace(tag, std::move(st));
    return Status::Ok();
  }
  ZINF_ASSIGN_OR_RETURN(st.pinned, TakePinned(total));
  ZINF_ASSIGN_OR_RETURN(st.done, TakeEvent());
  char* host = pinned_[size_t(st.pinned)].p;
  size_t off = 0;
  for (const SendOp& s : sends) {
    if (s.bytes == 0) continue;
    std::memcpy(host + off, s.data, s.bytes);
    off += Up(s.bytes);
  }
  cudaError_t e = cudaMallocAsync(&st.dev, total, stream_);
  if (e == cudaSuccess && st.send_bytes > 0)
    e = cudaMemcpyAsync(st.dev, host, st.send_bytes, cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) {
    Release(st);
    return Fail(CudaError(e, fmt::format("staging a step of {} bytes", total)));
  }
  char* dev = static_cast<char*>(st.dev);
  ncclResult_t first = ncclGroupStart();
  off = 0;
  for (const SendOp& s : sends) {
    if (s.bytes == 0 || first != ncclSuccess) continue;
    first = ncclSend(dev + off, s.bytes, ncclUint8, s.peer, comm_, stream_);
    off += Up(s.bytes);
  }
  off = st.send_bytes;
  for (const RecvOp& r : st.recvs) {
    if (first != ncclSuccess) break;
    first = ncclRecv(dev + off, r.bytes, ncclUint8, r.peer, comm_, stream_);
    off += Up(r.bytes);
  }
  // Always ended: NCCL's group depth is per thread, and other communicators share this thread.
  const ncclResult_t end = ncclGroupEnd();
  Step& placed = steps_.emplace(tag, std::move(st)).first->second;
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
  ZINF_RETURN_IF_ERROR(Use());
  const auto deadline = Clock::now() + timeout;
  Step& s = it->second;
  if (!s.launched) ZINF_RETURN_IF_ERROR(FinishLaunching(deadline, timeout));
  if (s.done != nullptr) {
    ZINF_RETURN_IF_ERROR(Until(deadline, timeout, s.peers, "moving a step's data",
                               [this, &s]() -> Result<bool> {
                                 const cudaError_t e = cudaEventQuery(s.done);
                                 if (e == cudaSuccess) return true;
                                 if (e != cudaErrorNotReady)
                                   return CudaError(e, "cudaEventQuery");
                                 Result<bool> started = Started();
                                 if (!started.ok()) return started.status();
                                 return false;
                               }));
    const char* host = pinned_[size_t(s.pinned)].p;
    size_t off = s.send_bytes;
    for (const RecvOp& r : s.recvs) {
      std::memcpy(r.data, host + off, r.bytes);
      off += Up(r.bytes);
    }
  }
  Release(s);
  steps_.erase(it);
  return Status::Ok();
}

// Nothing lands in the caller's buffers after this: only Wait copies into them.
void NcclTransport::Cancel() {
  Abort();
  steps_.clear();
  has_launching_ = false;
}

NcclTransport::~NcclTransport() {
  if (cudaSetDevice(ordinal_) != cudaSuccess) return;
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
  if (aborted_) return;  // the staging may still be written by copies queued behind the abort
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  for (cudaEvent_t e : events_) cudaEventDestroy(e);
  for (PinnedBlock& b : pinned_) cudaFreeHost(b.p);
}

Status NcclTransport::RunRaw(const char* what, const void* in, size_t in_bytes, void* out,
                             size_t out_bytes, bool in_place,
                             const std::function<ncclResult_t(char*, char*)>& op) {
  if (!failed_.ok()) return failed_;
  if (!steps_.empty()) return Internal(fmt::format("{}: {} with steps in flight", Who(), what));
  ZINF_RETURN_IF_ERROR(Use());
  const size_t out_off = in_place ? 0 : Up(in_bytes);
  Step st;
  st.peers = Everyone();
  ZINF_ASSIGN_OR_RETURN(st.pinned, TakePinned(out_off + std::max(in_bytes, out_bytes)));
  ZINF_ASSIGN_OR_RETURN(st.done, TakeEvent());
  char* host = pinned_[size_t(st.pinned)].p;
  std::memcpy(host, in, in_bytes);
  cudaError_t e = cudaMallocAsync(&st.dev, out_off + std::max(in_bytes, out_bytes), stream_);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(st.dev, host, in_bytes, cudaMemcpyHostToDevice, stream_);
  if (e != cudaSuccess) return Fail(CudaError(e, std::string("staging ") + what));
  char* dev = static_cast<char*>(st.dev);
  const ncclResult_t r = op(dev, dev + out_off);
  const auto deadline = Clock::now() + timeout_;
  if (r == ncclInProgress) {
    ZINF_RETURN_IF_ERROR(Until(deadline, timeout_, st.peers, what, [this] { return Started(); }));
  } else if (r != ncclSuccess) {
    return Fail(NcclError(r, what));
  }
  e = cudaMemcpyAsync(host + out_off, dev + out_off, out_bytes, cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaFreeAsync(st.dev, stream_);
  if (e == cudaSuccess) e = cudaEventRecord(st.done, stream_);
  if (e != cudaSuccess) return Fail(CudaError(e, std::string("copying back ") + what));
  ZINF_RETURN_IF_ERROR(Until(deadline, timeout_, st.peers, what, [this, &st]() -> Result<bool> {
    const cudaError_t q = cudaEventQuery(st.done);
    if (q == cudaSuccess) return true;
    if (q != cudaErrorNotReady) return CudaError(q, "cudaEventQuery");
    Result<bool> started = Started();
    if (!started.ok()) return started.status();
    return false;
  }));
  std::memcpy(out, host + out_off, out_bytes);
  Release(st);
  return Status::Ok();
}

Status NcclTransport::Start() {
  // This rank's GPU: does it answer, and which one is it.
  Hello mine;
  std::string problem;
  cudaError_t e = cudaSetDevice(ordinal_);
  if (e == cudaSuccess) e = cudaFree(nullptr);  // creates the context now
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(mine.bus_id, sizeof(mine.bus_id), ordinal_);
  if (e != cudaSuccess) {
    problem = fmt::format("GPU {} does not answer: {} ({})", ordinal_, cudaGetErrorString(e),
                          cudaGetErrorName(e));
  }
  mine.ok = problem.empty() ? 1 : 0;
  CopyText(mine.text, sizeof(mine.text), problem);
  bus_id_ = mine.bus_id;

  // Every rank tells rank 0; rank 0 answers with NCCL's id, or with the first rank that cannot.
  Reply reply;
  Status s;
  if (rank_ == 0) {
    std::vector<Hello> all(static_cast<size_t>(world_));
    all[0] = mine;
    std::vector<RecvOp> recvs;
    for (int p = 1; p < world_; ++p) recvs.push_back({p, &all[size_t(p)], sizeof(Hello)});
    s = rdv_->Exchange(kHelloTag, {}, recvs, timeout_);
    if (!s.ok()) return s.WithContext(Who() + ": NCCL's set-up");
    for (int p = 0; p < world_ && reply.bad_rank < 0; ++p) {
      if (all[size_t(p)].ok == 0) {
        reply.bad_rank = p;
        CopyText(reply.text, sizeof(reply.text), all[size_t(p)].text);
      }
      for (int q = 0; q < p && reply.bad_rank < 0; ++q) {
        if (std::strncmp(all[size_t(p)].bus_id, all[size_t(q)].bus_id, 32) != 0) continue;
        reply.bad_rank = p;
        CopyText(reply.text, sizeof(reply.text),
                 fmt::format("it uses the GPU at PCI {} as rank {} does: NCCL needs one GPU "
                             "per rank (LOCAL_RANK picks it; check CUDA_VISIBLE_DEVICES)",
                             all[size_t(p)].bus_id, Global(q)));
      }
    }
    if (reply.bad_rank < 0) {
      const ncclResult_t r = ncclGetUniqueId(&reply.id);
      if (r != ncclSuccess) {
        reply.bad_rank = 0;
        CopyText(reply.text, sizeof(reply.text),
                 fmt::format("ncclGetUniqueId: {}", ncclGetErrorString(r)));
      }
    }
    reply.ok = reply.bad_rank < 0 ? 1 : 0;
    std::vector<SendOp> sends;
    for (int p = 1; p < world_; ++p) sends.push_back({p, &reply, sizeof(Reply)});
    s = rdv_->Exchange(kReplyTag, sends, {}, timeout_);
  } else {
    const SendOp hello{0, &mine, sizeof(Hello)};
    s = rdv_->Exchange(kHelloTag, {&hello, 1}, {}, timeout_);
    const RecvOp answer{0, &reply, sizeof(Reply)};
    if (s.ok()) s = rdv_->Exchange(kReplyTag, {}, {&answer, 1}, timeout_);
  }
  if (!s.ok()) return s.WithContext(Who() + ": NCCL's set-up");
  if (reply.ok == 0) {
    reply.text[kText - 1] = '\0';
    return FailedPrecondition(fmt::format("{}: NCCL cannot start: rank {}: {}", Who(),
                                          Global(reply.bad_rank), reply.text));
  }

  e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
  if (e != cudaSuccess) return Fail(CudaError(e, "cudaStreamCreateWithFlags"));
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t r = ncclCommInitRankConfig(&comm_, world_, reply.id, rank_, &config);
  if (r != ncclSuccess && r != ncclInProgress)
    return Fail(NcclError(r, "ncclCommInitRankConfig"));
  ZINF_RETURN_IF_ERROR(Until(Clock::now() + timeout_, timeout_, Everyone(),
                             "joining NCCL's communicator", [this] { return Started(); }));
  describe_ = fmt::format("nccl {} GPU {} ({}), {} ranks", NcclVersion(), ordinal_, bus_id_,
                          world_);
  return Status::Ok();
}

}  // namespace

bool NcclBuilt() { return true; }

std::string NcclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "";
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

namespace {
NcclTransport* AsNccl(Transport& t) { return dynamic_cast<NcclTransport*>(&t); }
Status NotNccl() { return InvalidArgument("NcclRaw: the transport is not NCCL's"); }
}  // namespace

Status NcclRaw::AllReduce(Transport& transport, float* buf, size_t count) {
  NcclTransport* t = AsNccl(transport);
  if (t == nullptr) return NotNccl();
  return t->RunRaw("ncclAllReduce", buf, count * 4, buf, count * 4, true,
                   [t, count](char* in, char* out) {
                     return ncclAllReduce(in, out, count, ncclFloat32, ncclSum, t->comm(),
                                          t->stream());
                   });
}

Status NcclRaw::AllGather(Transport& transport, const float* send, float* recv, size_t count) {
  NcclTransport* t = AsNccl(transport);
  if (t == nullptr) return NotNccl();
  return t->RunRaw("ncclAllGather", send, count * 4, recv, count * 4 * size_t(t->world()), false,
                   [t, count](char* in, char* out) {
                     return ncclAllGather(in, out, count, ncclFloat32, t->comm(), t->stream());
                   });
}

Status NcclRaw::ReduceScatter(Transport& transport, const float* send, float* recv,
                              size_t count) {
  NcclTransport* t = AsNccl(transport);
  if (t == nullptr) return NotNccl();
  return t->RunRaw("ncclReduceScatter", send, count * 4 * size_t(t->world()), recv, count * 4,
                   false, [t, count](char* in, char* out) {
                     return ncclReduceScatter(in, out, count, ncclFloat32, ncclSum, t->comm(),
                                              t->stream());
                   });
}

Result<std::unique_ptr<Transport>> ConnectNccl(std::unique_ptr<Transport> rendezvous,
                                               std::span<const int> members, int cuda_ordinal,
                                               Ms timeout) {
  if (rendezvous == nullptr) return InvalidArgument("ConnectNccl: no rendezvous transport");
  auto t = std::make_unique<NcclTransport>(std::move(rendezvous), members, cuda_ordinal, timeout);
  ZINF_RETURN_IF_ERROR(t->Start());
  return std::unique_ptr<Transport>(std::move(t));
}

}  // namespace zinf::comm
