#include "src/comm/communicator.h"

#include <condition_variable>
#include <mutex>
#include <vector>

#include <fmt/format.h>

#include "src/comm/work_state.h"

namespace zinf::comm {

size_t DTypeBytes(DType t) {
  switch (t) {
    case DType::kU8: return 1;
    case DType::kBf16:
    case DType::kF16: return 2;
    case DType::kI32:
    case DType::kF32: return 4;
    case DType::kI64:
    case DType::kF64: return 8;
  }
  return 1;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kU8: return "u8";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kF32: return "f32";
    case DType::kF64: return "f64";
    case DType::kBf16: return "bf16";
    case DType::kF16: return "f16";
  }
  return "?";
}

const char* OpKindName(OpKind k) {
  switch (k) {
    case OpKind::kAllGather: return "all_gather";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAllReduce: return "all_reduce";
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kBarrier: return "barrier";
  }
  return "?";
}

uint64_t CommStats::total_sent() const {
  uint64_t t = 0;
  for (uint64_t b : bytes_sent) t += b;
  return t;
}

uint64_t CommStats::total_received() const {
  uint64_t t = 0;
  for (uint64_t b : bytes_received) t += b;
  return t;
}

void Work::State::Finish(Status s) {
  {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
  }
  cv.notify_all();
}

Status Work::Wait() const {
  if (!state_) return FailedPrecondition("wait on an empty Work (no operation was issued)");
  if (state_->runner != nullptr && !Done()) state_->runner->RunUpTo(state_.get());
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->cv.wait(lock, [&] { return state_->done; });
  return state_->status;
}

bool Work::Done() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

Work Work::Finished(Status s) {
  auto st = std::make_shared<State>();
  st->Finish(std::move(s));
  return Work(std::move(st));
}

Status Communicator::CheckAgreement(uint64_t hash, std::string_view what) {
  std::vector<uint64_t> all(static_cast<size_t>(world()));
  ZINF_RETURN_IF_ERROR(AllGather(&hash, all.data(), 1, DType::kI64).Wait());
  std::string differ;
  for (int p = 1; p < world(); ++p) {
    if (all[size_t(p)] == all[0]) continue;
    differ += fmt::format("{}rank {} ({:016x})", differ.empty() ? "" : ", ", p, all[size_t(p)]);
  }
  if (differ.empty()) return Status::Ok();
  return FailedPrecondition(fmt::format(
      "the ranks disagree on {}: rank 0 has {:016x}, and {} differ{}; every rank must start "
      "with the same one",
      what, all[0], differ, differ.find(',') == std::string::npos ? "s" : ""));
}

}  // namespace zinf::comm
