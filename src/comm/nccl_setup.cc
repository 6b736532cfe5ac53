// NcclTransport's set-up (every rank's GPU checked through rank 0, NCCL's id handed out, the
// non-blocking communicator), NCCL's own collectives for bench-comm, the version.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <utility>

#include <fmt/format.h>

#include "src/comm/nccl_transport_impl.h"

namespace zinf::comm {
ZINF_NCCL_BUILD_BEGIN
namespace nccl_detail {
namespace {

// The two set-up messages' tags on the rendezvous transport (used for nothing else).
constexpr uint64_t kHelloTag = 0x7a696e666e63636cULL;  // "zinfnccl"
constexpr uint64_t kReplyTag = kHelloTag + 1;
constexpr size_t kText = 240;

// What each rank tells rank 0 before NCCL starts, and rank 0's answer (plain bytes on the wire:
// every rank runs the same build). A GPU is (machine, PCI bus id): the bus ids repeat on every
// node of a cluster.
struct Hello {
  uint8_t ok = 0;
  char machine[64] = {};
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

// This boot of this machine (containers on one host share it, as they share its GPUs); the host
// name when the kernel does not say.
std::string MachineId() {
  std::string id;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  if (f && std::getline(f, id) && !id.empty()) return id;
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return host;
}

// What makes this rank unable to run NCCL, or "" when nothing does.
std::string LocalProblem(int ordinal, Hello* mine) {
  if (const char* b = std::getenv("NCCL_COMM_BLOCKING"); b != nullptr && std::strcmp(b, "0") != 0)
    return fmt::format("NCCL_COMM_BLOCKING={} is set: it would make NCCL's set-up and launches "
                       "wait without zinf.comm.timeout_seconds; unset it",
                       b);
  cudaError_t e = cudaFree(nullptr);  // creates the context now
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(mine->bus_id, sizeof(mine->bus_id), ordinal);
  if (e != cudaSuccess)
    return fmt::format("GPU {} does not answer: {} ({})", ordinal, cudaGetErrorString(e),
                       cudaGetErrorName(e));
  return "";
}

}  // namespace

Status NcclTransport::Start() {
  DeviceScope device(ordinal_);
  Hello mine;
  std::string problem = device.status() == cudaSuccess
                            ? LocalProblem(ordinal_, &mine)
                            : fmt::format("GPU {} does not answer: {} ({})", ordinal_,
                                          cudaGetErrorString(device.status()),
                                          cudaGetErrorName(device.status()));
  mine.ok = problem.empty() ? 1 : 0;
  CopyText(mine.text, sizeof(mine.text), problem);
  CopyText(mine.machine, sizeof(mine.machine), MachineId());
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
      const Hello& h = all[size_t(p)];
      if (h.ok == 0) {
        reply.bad_rank = p;
        CopyText(reply.text, sizeof(reply.text), std::string(h.text, strnlen(h.text, kText)));
      }
      for (int q = 0; q < p && reply.bad_rank < 0; ++q) {
        const Hello& o = all[size_t(q)];
        if (std::strncmp(h.bus_id, o.bus_id, sizeof(h.bus_id)) != 0 ||
            std::strncmp(h.machine, o.machine, sizeof(h.machine)) != 0)
          continue;
        reply.bad_rank = p;
        CopyText(reply.text, sizeof(reply.text),
                 fmt::format("it uses the GPU at PCI {} as rank {} does: NCCL needs one GPU "
                             "per rank (LOCAL_RANK picks it; check CUDA_VISIBLE_DEVICES)",
                             std::string(h.bus_id, strnlen(h.bus_id, sizeof(h.bus_id))),
                             Global(q)));
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
    return FailedPrecondition(fmt::format("{}: NCCL cannot start: rank {}: {}", Who(),
                                          Global(reply.bad_rank),
                                          std::string(reply.text, strnlen(reply.text, kText))));
  }

  cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
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

Status NcclTransport::RunRaw(const char* what, const void* in, size_t in_bytes, void* out,
                             size_t out_bytes, bool in_place,
                             const std::function<ncclResult_t(char*, char*)>& op) {
  DeviceScope device(ordinal_);
  ZINF_RETURN_IF_ERROR(Enter(device));
  if (!steps_.empty()) return Internal(fmt::format("{}: {} with steps in flight", Who(), what));
  const size_t out_off = in_place ? 0 : Up(in_bytes);
  const size_t total = out_off + std::max(in_bytes, out_bytes);
  Step st;
  st.peers = Everyone();
  ZINF_ASSIGN_OR_RETURN(st.pinned, TakePinned(total));
  ZINF_ASSIGN_OR_RETURN(st.done, TakeEvent());
  char* host = pinned_[size_t(st.pinned)].p;
  std::memcpy(host, in, in_bytes);
  cudaError_t e = cudaMallocAsync(&st.dev, total, stream_);
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
  ZINF_RETURN_IF_ERROR(
      Until(deadline, timeout_, st.peers, what, [this, &st] { return Reached(st.done); }));
  std::memcpy(out, host + out_off, out_bytes);
  Release(st);
  return Status::Ok();
}

}  // namespace nccl_detail

using nccl_detail::NcclTransport;

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
                                               std::chrono::milliseconds timeout,
                                               size_t staging_cap) {
  if (rendezvous == nullptr) return InvalidArgument("ConnectNccl: no rendezvous transport");
  auto t = std::make_unique<NcclTransport>(std::move(rendezvous), members, cuda_ordinal, timeout,
                                           staging_cap);
  ZINF_RETURN_IF_ERROR(t->Start());
  return std::unique_ptr<Transport>(std::move(t));
}

ZINF_NCCL_BUILD_END
}  // namespace zinf::comm
