#include "io/fault_backend.h"

#include <cerrno>

namespace zinf::io {

FaultRule RandomFaults(const RandomFaultPlan& plan) {
  auto rng = std::make_shared<std::mt19937_64>(plan.seed);
  auto mu = std::make_shared<std::mutex>();
  return [plan, rng, mu](const Piece& p) -> Fault {
    if (plan.only && *plan.only != p.op) return {};
    std::lock_guard lock(*mu);
    double x = std::uniform_real_distribution<double>(0, 1)(*rng);
    auto take = [&x](double prob) {
      if (x < prob) return true;
      x -= prob;
      return false;
    };
    if (take(plan.p_short)) {
      uint32_t units = p.len / plan.align;
      if (units >= 2) {
        uint32_t keep = 1 + static_cast<uint32_t>((*rng)() % (units - 1));
        return {Fault::kShort, 0, keep * plan.align};
      }
      return {};
    }
    if (take(plan.p_eagain)) return {Fault::kErrno, EAGAIN, 0};
    if (take(plan.p_eintr)) return {Fault::kErrno, EINTR, 0};
    if (take(plan.p_eio)) return {Fault::kErrno, EIO, 0};
    if (take(plan.p_enospc)) return {Fault::kErrno, ENOSPC, 0};
    return {};
  };
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultRule rule)
    : inner_(std::move(inner)), rule_(std::move(rule)) {}

void FaultInjectingBackend::set_rule(FaultRule rule) { rule_ = std::move(rule); }

FaultCounts FaultInjectingBackend::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

Status FaultInjectingBackend::Prepare(const Piece& piece) {
  Fault f = rule_ ? rule_(piece) : Fault{};
  std::lock_guard lock(mu_);
  if (f.kind == Fault::kErrno) {
    synthetic_.push_back({piece.tag, -static_cast<int64_t>(f.err)});
    counts_.errors++;
    if (f.err == EAGAIN) counts_.eagain++;
    if (f.err == EINTR) counts_.eintr++;
    if (f.err == EIO) counts_.eio++;
    if (f.err == ENOSPC) counts_.enospc++;
    return Status::Ok();
  }
  Piece p = piece;
  if (f.kind == Fault::kShort && f.short_len > 0 && f.short_len < piece.len) {
    p.len = f.short_len;
    counts_.shorts++;
  } else {
    counts_.passed++;
  }
  Status s = inner_->Prepare(p);
  if (s.ok()) inner_inflight_++;
  return s;
}

Result<size_t> FaultInjectingBackend::Wait(std::span<RawCompletion> out, size_t min_complete) {
  size_t got = 0;
  size_t inner_min;
  {
    std::lock_guard lock(mu_);
    while (!synthetic_.empty() && got < out.size()) {
      out[got++] = synthetic_.back();
      synthetic_.pop_back();
    }
    size_t still = min_complete > got ? min_complete - got : 0;
    inner_min = std::min(still, inner_inflight_);
    if (got == out.size() || (inner_inflight_ == 0)) return got;
  }
  auto r = inner_->Wait(out.subspan(got), inner_min);
  if (!r.ok()) return r.status();
  std::lock_guard lock(mu_);
  inner_inflight_ -= *r;
  return got + *r;
}

}  // namespace zinf::io
