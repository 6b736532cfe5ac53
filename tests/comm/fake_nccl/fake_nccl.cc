// The fake CUDA runtime and NCCL of this directory's headers; their contracts are there.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "tests/comm/fake_nccl/cuda_runtime.h"
#include "tests/comm/fake_nccl/fake_nccl_control.h"
#include "tests/comm/fake_nccl/nccl.h"

namespace {

struct World {
  int n = 0, joined = 0;
};

struct Op {
  enum Kind { kSend, kRecv, kAllReduce, kAllGather, kReduceScatter } kind;
  zinf_fake_comm* comm;
  const void* send;
  void* recv;
  size_t count;
  ncclDataType_t type;
  int peer;
  cudaStream_t stream;
};

size_t Bytes(ncclDataType_t t) { return t == ncclFloat32 ? 4 : 1; }

// Never destroyed: stream threads and leaked (aborted) objects may outlive static destructors.
struct Globals {
  std::mutex mu;  // everything here, and the communicators' state
  std::condition_variable cv;
  std::atomic<int> devices{8};
  std::map<const char*, size_t> pinned;  // start -> bytes
  std::set<void*> device;                // device allocations not yet freed
  uint64_t pinned_bytes = 0, pinned_peak = 0;
  std::vector<std::string> breaches;
  std::map<std::string, std::shared_ptr<World>> worlds;
  // Bytes in flight: (world, from, to, channel) -> a byte stream, as NCCL's connection between
  // two ranks is: a receive takes the next `count` bytes whatever the sends' sizes (a smaller
  // one leaves the rest for the next receive, a larger one waits for more). Channel 0: sends and
  // receives; 1: the collectives' inputs.
  std::map<std::tuple<const World*, int, int, int>, std::deque<char>> boxes;
  uint64_t next_id = 0;
  std::string last_error;
};
Globals& G() {
  static Globals* g = new Globals;
  return *g;
}
thread_local int t_device = 0;
thread_local int t_group_depth = 0;
thread_local std::vector<Op> t_group;

void BreachLocked(std::string what) { G().breaches.push_back(std::move(what)); }

bool PinnedLocked(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  auto it = G().pinned.upper_bound(c);
  if (it == G().pinned.begin()) return false;
  --it;
  return c >= it->first && c + n <= it->first + it->second;
}

}  // namespace

struct zinf_fake_stream {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::function<void()>> queue;
  bool busy = false, stop = false;
  int starting = 0;  // communicators starting a call on this stream (under G().mu)
  std::thread worker;

  void Run() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return stop || !queue.empty(); });
      if (queue.empty()) return;  // stopped, and the work queued before is done (as CUDA's)
      std::function<void()> op = std::move(queue.front());
      queue.pop_front();
      busy = true;
      lock.unlock();
      op();
      lock.lock();
      busy = false;
      cv.notify_all();
    }
  }
};

struct zinf_fake_event {
  std::atomic<uint64_t> recorded{0}, reached{0};
};

struct zinf_fake_comm {
  std::shared_ptr<World> world;
  int rank = 0;
  bool blocking = true;
  enum State { kJoining, kReady, kStarting, kFinalizing, kDone } state = kJoining;
  int polls = 0;
  uint64_t groups = 0;
  std::vector<Op> pending;  // the group being started
  bool aborted = false;
  std::string last;
};

namespace {

void Enqueue(cudaStream_t s, std::function<void()> op, const char* what) {
  {
    std::lock_guard<std::mutex> lock(G().mu);
    if (s->starting > 0)
      BreachLocked(std::string("queued ") + what +
                   " on a stream whose NCCL communicator is still starting a call");
  }
  std::lock_guard<std::mutex> lock(s->mu);
  s->queue.push_back(std::move(op));
  s->cv.notify_all();
}

void Deposit(const zinf_fake_comm* c, int to, int channel, const void* data, size_t bytes) {
  std::lock_guard<std::mutex> lock(G().mu);
  const char* p = static_cast<const char*>(data);
  auto& box = G().boxes[{c->world.get(), c->rank, to, channel}];
  box.insert(box.end(), p, p + bytes);
  G().cv.notify_all();
}

// The next `bytes` bytes from `from`, or false when the communicator was aborted first.
bool Take(zinf_fake_comm* c, int from, int channel, size_t bytes, std::vector<char>* out) {
  std::unique_lock<std::mutex> lock(G().mu);
  auto& box = G().boxes[{c->world.get(), from, c->rank, channel}];
  G().cv.wait(lock, [&] { return c->aborted || box.size() >= bytes; });
  if (c->aborted) return false;
  out->assign(box.begin(), box.begin() + std::ptrdiff_t(bytes));
  box.erase(box.begin(), box.begin() + std::ptrdiff_t(bytes));
  return true;
}

// One group's work, on its stream's thread: the sends and the collectives' inputs go out first
// (eagerly, as NCCL's buffered protocols do), then the receives wait.
void RunGroup(const std::vector<Op>& ops) {
  for (const Op& o : ops) {
    if (o.kind == Op::kSend) Deposit(o.comm, o.peer, 0, o.send, o.count * Bytes(o.type));
    if (o.kind == Op::kAllReduce || o.kind == Op::kAllGather || o.kind == Op::kReduceScatter) {
      const size_t n = o.kind == Op::kReduceScatter ? o.count * size_t(o.comm->world->n)
                                                    : o.count;
      for (int p = 0; p < o.comm->world->n; ++p)
        if (p != o.comm->rank) Deposit(o.comm, p, 1, o.send, n * Bytes(o.type));
    }
  }
  for (const Op& o : ops) {
    zinf_fake_comm* c = o.comm;
    std::vector<char> got;
    if (o.kind == Op::kRecv) {
      if (!Take(c, o.peer, 0, o.count * Bytes(o.type), &got)) return;
      std::memcpy(o.recv, got.data(), got.size());
      continue;
    }
    if (o.kind == Op::kSend) continue;
    const int w = c->world->n;
    const size_t n = o.kind == Op::kReduceScatter ? o.count * size_t(w) : o.count;
    std::vector<std::vector<float>> in(static_cast<size_t>(w), std::vector<float>(n));
    for (int p = 0; p < w; ++p) {
      if (p == c->rank) {
        std::memcpy(in[size_t(p)].data(), o.send, n * 4);
      } else {
        if (!Take(c, p, 1, n * 4, &got)) return;
        std::memcpy(in[size_t(p)].data(), got.data(), n * 4);
      }
    }
    float* out = static_cast<float*>(o.recv);
    if (o.kind == Op::kAllGather) {
      for (int p = 0; p < w; ++p)
        std::memcpy(out + size_t(p) * n, in[size_t(p)].data(), n * 4);
    } else {
      const size_t m = o.count, base = o.kind == Op::kReduceScatter ? size_t(c->rank) * m : 0;
      for (size_t i = 0; i < m; ++i) {
        float s = 0;
        for (int p = 0; p < w; ++p) s += in[size_t(p)][base + i];
        out[i] = s;
      }
    }
  }
}

void Launch(std::vector<Op> ops) {
  cudaStream_t s = ops.front().stream;
  Enqueue(s, [ops = std::move(ops)] { RunGroup(ops); }, "NCCL's work");
}

ncclResult_t Refuse(zinf_fake_comm* c, const std::string& why) {
  BreachLocked(why);
  if (c != nullptr) c->last = why;
  G().last_error = why;
  return ncclInvalidUsage;
}

ncclResult_t Add(const Op& op) {
  t_group.push_back(op);
  if (t_group_depth > 0) return ncclSuccess;
  t_group_depth = 1;
  return ncclGroupEnd();
}

}  // namespace

// --- CUDA ---

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorMemoryAllocation: return "out of memory";
    default: return "invalid argument";
  }
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    default: return "cudaErrorInvalidValue";
  }
}

cudaError_t cudaGetDevice(int* device) {
  if (G().devices == 0) return cudaErrorNoDevice;
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (G().devices == 0) return cudaErrorNoDevice;
  if (device < 0 || device >= G().devices) return cudaErrorInvalidDevice;
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (G().devices == 0) return cudaErrorNoDevice;
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* bus_id, int len, int device) {
  if (device < 0 || device >= G().devices) return cudaErrorInvalidDevice;
  std::snprintf(bus_id, size_t(len), "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned /*flags*/) {
  auto* stream = new zinf_fake_stream;
  stream->worker = std::thread([stream] { stream->Run(); });
  *s = stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  std::unique_lock<std::mutex> lock(s->mu);
  s->cv.wait(lock, [&] { return s->queue.empty() && !s->busy; });
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(s->mu);
    s->stop = true;
    s->cv.notify_all();
  }
  s->worker.join();
  delete s;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned /*flags*/) {
  *e = new zinf_fake_event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  const uint64_t gen = ++e->recorded;
  Enqueue(s, [e, gen] { e->reached = gen; }, "an event");
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  return e->reached >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete e;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned /*flags*/) {
  char* m = static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096));
  if (m == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(G().mu);
  G().pinned[m] = bytes;
  G().pinned_bytes += bytes;
  G().pinned_peak = std::max(G().pinned_peak, G().pinned_bytes);
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  std::lock_guard<std::mutex> lock(G().mu);
  auto it = G().pinned.find(static_cast<const char*>(p));
  if (it == G().pinned.end()) return cudaErrorInvalidValue;
  G().pinned_bytes -= it->second;
  G().pinned.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t /*s*/) {
  *p = std::malloc(std::max<size_t>(bytes, 1));
  if (*p == nullptr) return cudaErrorMemoryAllocation;
  std::lock_guard<std::mutex> lock(G().mu);
  G().device.insert(*p);  // an abandoned one stays reachable: no leak report
  return cudaSuccess;
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t s) {
  Enqueue(s, [p] {
    {
      std::lock_guard<std::mutex> lock(G().mu);
      G().device.erase(p);
    }
    std::free(p);
  }, "a free");
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s) {
  {
    std::lock_guard<std::mutex> lock(G().mu);
    const void* host = kind == cudaMemcpyHostToDevice ? src : dst;
    if (bytes > 0 && !PinnedLocked(host, bytes))
      BreachLocked("a copy from or to pageable host memory (CUDA runs it synchronously)");
  }
  Enqueue(s, [dst, src, bytes] { std::memcpy(dst, src, bytes); }, "a copy");
  return cudaSuccess;
}

// --- NCCL ---

ncclResult_t ncclGetVersion(int* version) {
  *version = 22800;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclInProgress: return "NCCL operation in progress";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    default: return "fake NCCL error";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(G().mu);
  if (comm != nullptr && comm->aborted)
    BreachLocked("ncclGetLastError on an aborted communicator (ncclCommAbort freed it)");
  copy = comm != nullptr ? comm->last : G().last_error;
  return copy.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::lock_guard<std::mutex> lock(G().mu);
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "fake-%llu",
                static_cast<unsigned long long>(G().next_id++));
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (G().devices == 0) return ncclUnhandledCudaError;
  std::unique_lock<std::mutex> lock(G().mu);
  auto& w = G().worlds[std::string(id.internal, strnlen(id.internal, sizeof(id.internal)))];
  if (w == nullptr) {
    w = std::make_shared<World>();
    w->n = nranks;
  }
  if (w->n != nranks || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  auto* c = new zinf_fake_comm;  // kept: the registry below holds it
  c->world = w;
  c->rank = rank;
  c->blocking = config == nullptr || config->blocking != 0;
  ++w->joined;
  G().cv.notify_all();
  static std::vector<zinf_fake_comm*>* all = new std::vector<zinf_fake_comm*>;
  all->push_back(c);
  *comm = c;
  if (!c->blocking) return ncclInProgress;
  G().cv.wait(lock, [&] { return w->joined == w->n; });
  c->state = zinf_fake_comm::kReady;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  std::unique_lock<std::mutex> lock(G().mu);
  if (c->aborted) return Refuse(c, "ncclCommGetAsyncError on an aborted communicator");
  *state = ncclSuccess;
  switch (c->state) {
    case zinf_fake_comm::kJoining:
      if (c->world->joined < c->world->n) {
        *state = ncclInProgress;
      } else {
        c->state = zinf_fake_comm::kReady;
      }
      break;
    case zinf_fake_comm::kStarting: {
      if (++c->polls < 2) {
        *state = ncclInProgress;
        break;
      }
      c->state = zinf_fake_comm::kReady;
      std::vector<Op> ops = std::move(c->pending);
      c->pending.clear();
      ops.front().stream->starting--;
      lock.unlock();
      Launch(std::move(ops));
      break;
    }
    case zinf_fake_comm::kFinalizing: c->state = zinf_fake_comm::kDone; break;
    default: break;
  }
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(G().mu);
  if (c->state != zinf_fake_comm::kReady || c->aborted)
    return Refuse(c, "ncclCommFinalize on a communicator not ready");
  c->state = zinf_fake_comm::kFinalizing;
  return c->blocking ? ncclSuccess : ncclInProgress;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(G().mu);
  if (c->aborted) return Refuse(c, "ncclCommDestroy on an aborted communicator");
  if (c->state == zinf_fake_comm::kStarting || c->state == zinf_fake_comm::kFinalizing)
    return Refuse(c, "ncclCommDestroy while a call is still starting");
  c->state = zinf_fake_comm::kDone;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  std::lock_guard<std::mutex> lock(G().mu);
  if (c->aborted) return Refuse(c, "ncclCommAbort twice");
  if (c->state == zinf_fake_comm::kStarting) c->pending.front().stream->starting--;
  c->pending.clear();
  c->aborted = true;
  c->state = zinf_fake_comm::kDone;
  G().cv.notify_all();
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  ++t_group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (t_group_depth == 0) return ncclInvalidUsage;
  if (--t_group_depth > 0) return ncclSuccess;
  std::vector<Op> ops = std::move(t_group);
  t_group.clear();
  if (ops.empty()) return ncclSuccess;
  zinf_fake_comm* c = ops.front().comm;
  std::unique_lock<std::mutex> lock(G().mu);
  if (c->aborted || c->state != zinf_fake_comm::kReady)
    return Refuse(c, "an NCCL call on a communicator that is not ready (still starting one?)");
  if (!c->blocking && c->groups++ % 2 == 0) {
    c->state = zinf_fake_comm::kStarting;
    c->polls = 0;
    c->pending = std::move(ops);
    c->pending.front().stream->starting++;
    return ncclInProgress;
  }
  lock.unlock();
  Launch(std::move(ops));
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer,
                      ncclComm_t comm, cudaStream_t s) {
  return Add({Op::kSend, comm, buf, nullptr, count, type, peer, s});
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t s) {
  return Add({Op::kRecv, comm, nullptr, buf, count, type, peer, s});
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclRedOp_t /*op*/, ncclComm_t comm, cudaStream_t s) {
  return Add({Op::kAllReduce, comm, send, recv, count, type, -1, s});
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t s) {
  return Add({Op::kAllGather, comm, send, recv, count, type, -1, s});
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, ncclDataType_t type,
                               ncclRedOp_t /*op*/, ncclComm_t comm, cudaStream_t s) {
  return Add({Op::kReduceScatter, comm, send, recv, count, type, -1, s});
}

// --- control ---

namespace zinf::comm::fake_nccl {

void SetDeviceCount(int n) { G().devices = n; }
int CurrentDevice() { return t_device; }
uint64_t PinnedBytes() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().pinned_bytes;
}
uint64_t PinnedPeakBytes() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().pinned_peak;
}
void ResetPinnedPeak() {
  std::lock_guard<std::mutex> lock(G().mu);
  G().pinned_peak = G().pinned_bytes;
}
std::vector<std::string> Breaches() {
  std::lock_guard<std::mutex> lock(G().mu);
  return G().breaches;
}
void ClearBreaches() {
  std::lock_guard<std::mutex> lock(G().mu);
  G().breaches.clear();
}

}  // namespace zinf::comm::fake_nccl
