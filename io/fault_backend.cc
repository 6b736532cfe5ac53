#include "io/fault_backend.h"

#include <cerrno>

namespace zinf::io {

namespace {

// One uniform draw in [0, 1) shared out among outcomes of the given probabilities, in order:
// Take(p) is true with probability p of what is left.
struct Draw {
  double x;
  bool Take(double prob) {
    if (x < prob) return true;
    x -= prob;
    return false;
  }
};

}  // namespace

FaultRule RandomFaults(const RandomFaultPlan& plan) {
  auto rng = std::make_shared<std::mt19937_64>(plan.seed);
  auto mu = std::make_shared<std::mutex>();
  return [plan, rng, mu](const Piece& p) -> Fault {
    if (plan.only && *plan.only != p.op) return {};
    std::lock_guard lock(*mu);
    Draw d{std::uniform_real_distribution<double>(0, 1)(*rng)};
    auto take = [&d](double prob) { return d.Take(prob); };
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

SubmitRule RandomSubmitFaults(const RandomFaultPlan& plan) {
  // A different stream from RandomFaults' for the same seed.
  auto rng = std::make_shared<std::mt19937_64>(plan.seed ^ 0x5eed5eed5eed5eedull);
  auto mu = std::make_shared<std::mutex>();
  return [plan, rng, mu](unsigned queued) -> SubmitFault {
    std::lock_guard lock(*mu);
    Draw d{std::uniform_real_distribution<double>(0, 1)(*rng)};
    auto take = [&d](double prob) { return d.Take(prob); };
    if (take(plan.p_submit_eagain)) return {SubmitFault::kErrno, 0, EAGAIN};
    if (take(plan.p_submit_ebusy)) return {SubmitFault::kErrno, 0, EBUSY};
    if (take(plan.p_submit_eio)) return {SubmitFault::kErrno, 0, EIO};
    if (take(plan.p_submit_partial) && queued >= 2) {
      return {SubmitFault::kTake, 1 + static_cast<unsigned>((*rng)() % (queued - 1)), 0};
    }
    return {};
  };
}

FaultInjectingBackend::FaultInjectingBackend(std::unique_ptr<Backend> inner, FaultRule rule)
    : inner_(std::move(inner)), rule_(std::move(rule)) {}

void FaultInjectingBackend::set_rule(FaultRule rule) { rule_ = std::move(rule); }

bool FaultInjectingBackend::set_submit_rule(SubmitRule rule) {
  if (!rule) return inner_->SetSubmitRule(nullptr);
  return inner_->SetSubmitRule([this, rule = std::move(rule)](unsigned queued) {
    SubmitFault f = rule(queued);
    std::lock_guard lock(mu_);
    if (f.kind == SubmitFault::kErrno) {
      (IsTransientSubmitErrno(f.err) ? counts_.submit_transient : counts_.submit_hard)++;
    } else if (f.kind == SubmitFault::kTake && f.take < queued) {
      counts_.submit_partial++;
    }
    return f;
  });
}

FaultCounts FaultInjectingBackend::counts() const {
  std::lock_guard lock(mu_);
  return counts_;
}

Status FaultInjectingBackend::Prepare(const Piece& piece) {
  Fault f = rule_ ? rule_(piece) : Fault{};
  std::unique_lock lock(mu_);
  if (f.kind == Fault::kRefuse) {
    counts_.refused++;
    return Status::FromErrno(f.err, "prepare (refused by the fault injector)");
  }
  if (f.kind == Fault::kErrno) {
    staged_.push_back({piece.tag, -static_cast<int64_t>(f.err)});
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
  // Not under mu_: the inner backend takes its own lock, and its Flush calls the submit rule,
  // which takes mu_ (one lock order: the inner backend's, then mu_).
  lock.unlock();
  Status s = inner_->Prepare(p);
  if (s.ok()) {
    lock.lock();
    inner_inflight_++;
  }
  return s;
}

Status FaultInjectingBackend::Flush() {
  Status s = inner_->Flush();
  if (s.ok()) {
    std::lock_guard lock(mu_);
    synthetic_.insert(synthetic_.end(), staged_.begin(), staged_.end());
    staged_.clear();
  }
  return s;
}

std::vector<uint64_t> FaultInjectingBackend::Withdraw() {
  std::vector<uint64_t> tags = inner_->Withdraw();
  std::lock_guard lock(mu_);
  inner_inflight_ -= tags.size();
  for (const RawCompletion& c : staged_) tags.push_back(c.tag);
  staged_.clear();
  return tags;
}

void FaultInjectingBackend::HoldCompletions(bool hold) {
  std::lock_guard lock(hold_mu_);
  held_ = hold;
  hold_cv_.notify_all();
}

Result<size_t> FaultInjectingBackend::Wait(std::span<RawCompletion> out, size_t min_complete) {
  {
    std::unique_lock lock(hold_mu_);
    if (held_ && min_complete == 0) return size_t{0};
    hold_cv_.wait(lock, [&] { return !held_; });
  }
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
