// The build without NCCL (no CUDA, or no nccl.h / libnccl found, or ZINF_NCCL=OFF).
#include "src/comm/nccl_transport.h"

namespace zinf::comm {

bool NcclBuilt() { return false; }

std::string NcclVersion() { return ""; }

Result<std::unique_ptr<Transport>> ConnectNccl(std::unique_ptr<Transport> /*rendezvous*/,
                                               std::span<const int> /*members*/,
                                               int /*cuda_ordinal*/,
                                               std::chrono::milliseconds /*timeout*/,
                                               size_t /*staging_cap*/) {
  return Unimplemented(
      "this build of zinf has no NCCL transport: it was built without CUDA, or without NCCL's "
      "nccl.h and libnccl (looked for under the CUDA toolkit and NCCL_ROOT), or with "
      "-DZINF_NCCL=OFF; use zinf.comm.backend \"gloo\", or rebuild with NCCL");
}

Status NcclRaw::AllReduce(Transport&, float*, size_t) {
  return Unimplemented("this build of zinf has no NCCL transport");
}
Status NcclRaw::AllGather(Transport&, const float*, float*, size_t) {
  return Unimplemented("this build of zinf has no NCCL transport");
}
Status NcclRaw::ReduceScatter(Transport&, const float*, float*, size_t) {
  return Unimplemented("this build of zinf has no NCCL transport");
}

}  // namespace zinf::comm
