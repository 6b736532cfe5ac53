// src/train/train_summary.cc — TrainSummary::ToJson and the summary TrainLoop::Summarize
// writes at the end of a run (train_loop.h).
#include <algorithm>
#include <fstream>
#include <initializer_list>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "src/base/host_info.h"
#include "src/base/trace.h"
#include "src/runtime/offload_runtime.h"
#include "src/train/checkpoint.h"
#include "src/train/planner.h"
#include "src/train/ranks.h"
#include "src/train/sizing.h"
#include "src/train/train_loop.h"
#include "src/train/weights_io.h"

namespace zinf::train {

std::string TrainSummary::ToJson() const {
  // One list: every field, then the groups that exist only for some runs.
  nlohmann::json j = {{"steps", steps},
                      {"skipped_steps", skipped_steps},
                      {"params", params},
                      {"tokens_per_step", tokens_per_step},
                      {"first_loss", first_loss},
                      {"final_loss", final_loss},
                      {"tokens_per_s", tokens_per_s},
                      {"step_seconds_median", step_seconds_median},
                      {"stall_fraction", stall_fraction},
                      {"nvme_read_bytes", nvme_read_bytes},
                      {"nvme_write_bytes", nvme_write_bytes},
                      {"nvme_read_bytes_step_median", nvme_read_bytes_step_median},
                      {"nvme_write_bytes_step_median", nvme_write_bytes_step_median},
                      {"peak_device_bytes", peak_device_bytes},
                      {"device_budget_bytes", device_budget_bytes},
                      {"peak_pinned_bytes", peak_pinned_bytes},
                      {"pinned_budget_bytes", pinned_budget_bytes},
                      {"peak_rss_bytes", peak_rss_bytes},
                      {"prefetch_hits", prefetch_hits},
                      {"prefetch_misses", prefetch_misses},
                      {"param16_installs", param16_installs},
                      {"param16_derived_load_bytes", param16_derived_load_bytes},
                      {"h2d_bytes", h2d_bytes},
                      {"d2h_bytes", d2h_bytes},
                      {"h2d_bytes_step_median", h2d_bytes_step_median},
                      {"d2h_bytes_step_median", d2h_bytes_step_median},
                      {"plan_h2d_bytes_per_step", plan_h2d_bytes_per_step},
                      {"plan_d2h_bytes_per_step", plan_d2h_bytes_per_step},
                      {"device_evictions", device_evictions},
                      {"host_evictions", host_evictions},
                      {"device", device},
                      {"backend", backend},
                      {"io_engine", io_engine},
                      {"optimizer_state_bytes", optimizer_state_bytes},
                      {"optimizer_state_memory_bytes", optimizer_state_memory_bytes},
                      {"optimizer_state_nvme_bytes", optimizer_state_nvme_bytes},
                      {"placement", placement},
                      {"gradient_bytes", gradient_bytes},
                      {"param16_bytes", param16_bytes},
                      {"param16_derived_bytes", param16_derived_bytes},
                      {"swap_file_bytes", swap_file_bytes},
                      {"compute_seconds_per_step", compute_seconds},
                      {"stall_seconds_per_step", stall_seconds},
                      {"optimizer_wait_seconds_per_step", optimizer_wait_seconds},
                      {"grad_seconds_per_step", grad_seconds},
                      {"optimizer_seconds_per_step", optimizer_seconds},
                      {"adam_seconds_per_step", adam_seconds}};
  auto put = [&j](std::initializer_list<std::pair<const char*, nlohmann::json>> fields) {
    for (const auto& [key, value] : fields) j[key] = value;
  };
  if (val_loss >= 0) put({{"val_loss", val_loss}});
  if (resumed_from_step > 0) put({{"resumed_from_step", resumed_from_step}});
  if (stopped) put({{"stopped", true}});
  if (plan_nvme_read_bytes_per_step > 0 || plan_nvme_write_bytes_per_step > 0) {
    put({{"plan_nvme_read_bytes_per_step", plan_nvme_read_bytes_per_step},
         {"plan_nvme_write_bytes_per_step", plan_nvme_write_bytes_per_step}});
  }
  if (!last_checkpoint.empty()) {
    put({{"checkpoints", checkpoints},
         {"last_checkpoint", last_checkpoint},
         {"checkpoint_writer_seconds", checkpoint_writer_seconds},
         {"checkpoint_bytes_written", checkpoint_bytes_written},
         {"checkpoint_step_seconds_median", checkpoint_step_seconds_median},
         {"other_step_seconds_median", other_step_seconds_median}});
    if (plain_copies > 0) {
      put({{"plain_copies", plain_copies},
           {"plain_copy_bytes", plain_copy_bytes},
           {"plain_copy_seconds", plain_copy_seconds}});
    }
  }
  if (world > 1) {
    put({{"world", world},
         {"transport", transport},
         {"comm_sent_bytes_per_step", comm_sent_bytes_per_step},
         {"comm_received_bytes_per_step", comm_received_bytes_per_step},
         {"grad_comm_sent_bytes_per_step", grad_comm_sent_bytes_per_step},
         {"comm_seconds_per_step", comm_seconds}});
  }
  if (step_over_bound > 0) {
    put({{"compute_bound_seconds", compute_bound_seconds},
         {"io_bound_seconds", io_bound_seconds},
         {"adam_bound_seconds", adam_bound_seconds},
         {"step_over_bound", step_over_bound}});
    if (world > 1) put({{"comm_bound_seconds", comm_bound_seconds}});
  }
  return j.dump();
}

Result<TrainSummary> TrainLoop::Summarize() {
  SummarizeCheckpoints();
  SummarizeSteps();
  SummarizePlan();
  SummarizeTiers();
  SummarizeComm();
  ZINF_RETURN_IF_ERROR(SummarizeProfile());
  ZINF_RETURN_IF_ERROR(WriteOutputs());
  return sum_;
}

void TrainLoop::SummarizeSteps() {
  sum_.step_seconds_median = Median(acc_.step_times);
  sum_.nvme_read_bytes_step_median = Median(acc_.step_reads);
  sum_.nvme_write_bytes_step_median = Median(acc_.step_writes);
  sum_.h2d_bytes_step_median = Median(acc_.step_h2d);
  sum_.d2h_bytes_step_median = Median(acc_.step_d2h);
  const double t = acc_.time_total;
  sum_.tokens_per_s = t > 0 ? static_cast<double>(sum_.tokens_per_step * sum_.steps) / t : 0;
  sum_.stall_fraction = t > 0 ? acc_.stall_total / t : 0;
  if (sum_.steps > 0) {
    const ExecutorStats es = ex_.stats();
    const double n = static_cast<double>(sum_.steps);
    sum_.compute_seconds = es.compute_seconds / n;
    sum_.stall_seconds = (es.stall_seconds + es.optimizer_wait_seconds) / n;
    sum_.optimizer_wait_seconds = es.optimizer_wait_seconds / n;
    sum_.grad_seconds = es.grad_seconds / n;
    sum_.optimizer_seconds = es.optimizer_seconds / n;
    sum_.adam_seconds = es.adam_seconds / n;
  }
}

// REQUIRES: the checkpointer's last commit waited for (called first by Summarize).
void TrainLoop::SummarizeCheckpoints() {
  if (run_.checkpointer == nullptr) return;
  const CheckpointStats cs = run_.checkpointer->stats();
  sum_.checkpoints = cs.committed;
  sum_.last_checkpoint = cs.last_dir;
  sum_.checkpoint_writer_seconds = cs.writer_seconds;
  sum_.checkpoint_bytes_written = cs.bytes_written;
  sum_.checkpoint_step_seconds_median = Median(acc_.commit_step_times);
  sum_.other_step_seconds_median = Median(acc_.other_step_times);
  sum_.plain_copies = cs.plain_copies;
  sum_.plain_copy_bytes = cs.plain_copy_bytes;
  sum_.plain_copy_seconds = cs.plain_copy_seconds;
}

// What zinf plan predicts of this run's NVMe and link bytes a step, beside what it moved
// (across ranks: rank 0's, which reports them).
void TrainLoop::SummarizePlan() {
  const OffloadRuntime& rt = *run_.rt;
  PlanInputs pin;
  pin.dims = run_.model;
  pin.world = static_cast<uint32_t>(run_.ranks.shard_world());
  pin.batch = static_cast<int>(run_.B);
  pin.seq = static_cast<int>(run_.T);
  pin.micro_batches = static_cast<uint32_t>(run_.gas);
  pin.pinned_budget = rt.pool->budget_bytes();
  pin.state_generations = run_.eo.state_generations;
  pin.align = rt.swap != nullptr ? rt.swap->offset_align() : 4096;
  pin.device_budget = rt.device->budget_bytes();
  pin.device_reserved = ex_.stats().device_reserved_bytes;
  const Plan plan = PlanRun(c_, pin, run_.placement, {});
  if (UsesNvme(c_)) {
    sum_.plan_nvme_read_bytes_per_step = plan.nvme_read_per_step;
    sum_.plan_nvme_write_bytes_per_step = plan.nvme_write_per_step;
  }
  sum_.plan_h2d_bytes_per_step = plan.h2d_per_step;
  sum_.plan_d2h_bytes_per_step = plan.d2h_per_step;
}

void TrainLoop::SummarizeTiers() {
  const OffloadRuntime& rt = *run_.rt;
  const offload::TierStats ts = rt.tiers->stats();
  const ExecutorStats es = ex_.stats();
  sum_.nvme_read_bytes = ts.nvme_read_bytes + es.optimizer_bytes_read;
  sum_.nvme_write_bytes = ts.nvme_write_bytes + es.optimizer_bytes_written;
  sum_.prefetch_hits = ts.prefetch_hits;
  sum_.prefetch_misses = ts.prefetch_misses;
  sum_.param16_installs = ts.installs;
  sum_.param16_derived_load_bytes = ts.derived_bytes;
  sum_.peak_device_bytes = ts.peak_device_bytes;
  sum_.device_budget_bytes = rt.device->budget_bytes();
  sum_.peak_pinned_bytes = ts.peak_host_bytes;
  sum_.h2d_bytes = ts.h2d_bytes + es.gathered_h2d_bytes;
  sum_.d2h_bytes = ts.d2h_bytes + es.grad_d2h_bytes;
  sum_.device_evictions = ts.device_evictions;
  sum_.host_evictions = ts.host_evictions;
  sum_.peak_rss_bytes = PeakRssBytes();
  sum_.pinned_budget_bytes = rt.pool->budget_bytes();
  sum_.optimizer_state_bytes = StateBytesPerParam(c_) * ex_.StateParams();
  sum_.optimizer_state_memory_bytes = ex_.StateBytesInMemory();
  sum_.optimizer_state_nvme_bytes = ex_.StateBytesOnNvme();
  sum_.placement =
      run_.eo.optimizer_on_nvme ? run_.placement.Describe(run_.model) : "every unit in memory";
  sum_.gradient_bytes = ex_.GradShardBytes();
  sum_.param16_bytes = ex_.Param16ShardBytes();
  sum_.param16_derived_bytes = ex_.Param16DerivedBytes();
  sum_.swap_file_bytes = rt.swap != nullptr ? rt.swap->capacity() : 0;
}

void TrainLoop::SummarizeComm() {
  const Ranks& ranks = run_.ranks;
  if (ranks.comm == nullptr) return;
  // Every communicator's bytes (HYBRID_SHARD: the world's, the node's and the replicas').
  uint64_t sent = 0, received = 0;
  for (const auto* cm : {&ranks.comm, &ranks.shard_comm, &ranks.replica_comm}) {
    if (*cm == nullptr) continue;
    const comm::CommStats cs = (*cm)->stats();
    sent += cs.total_sent();
    received += cs.total_received();
  }
  const ExecutorStats es = ex_.stats();
  const double n = static_cast<double>(std::max<uint64_t>(1, sum_.steps));
  sum_.comm_sent_bytes_per_step = static_cast<double>(sent) / n;
  sum_.comm_received_bytes_per_step = static_cast<double>(received) / n;
  sum_.grad_comm_sent_bytes_per_step = static_cast<double>(es.grad_comm_sent_bytes) / n;
  sum_.comm_seconds = es.comm_seconds / n;
  sum_.transport = ranks.comm->Describe();
  if (ranks.shard_comm != nullptr) {
    sum_.transport += fmt::format("; HYBRID_SHARD: {} nodes of {} ranks",
                                  ranks.replica_comm->world(), ranks.shard_comm->world());
  }
}

// --profile: each bound measured alone in the same run, and the step over their max.
Status TrainLoop::SummarizeProfile() {
  if (!opt_.profile || sum_.steps == 0 || sum_.stopped) return Status::Ok();
  ZINF_ASSIGN_OR_RETURN(ProfileBounds b, ex_.MeasureBounds(x_.data(), y_.data(), run_.gas));
  sum_.compute_bound_seconds = b.compute_seconds;
  // The step's NVMe bytes at the rates the raw engine reaches alone on the same file.
  const double steps = static_cast<double>(sum_.steps);
  const double rd = static_cast<double>(sum_.nvme_read_bytes) / steps;
  const double wr = static_cast<double>(sum_.nvme_write_bytes) / steps;
  sum_.io_bound_seconds = (b.read_gbps > 0 ? rd / (b.read_gbps * 1e9) : 0) +
                          (b.write_gbps > 0 ? wr / (b.write_gbps * 1e9) : 0);
  sum_.adam_bound_seconds = b.adam_seconds;
  sum_.comm_bound_seconds = b.comm_seconds;
  const double bound = std::max({sum_.compute_bound_seconds, sum_.io_bound_seconds,
                                 sum_.adam_bound_seconds, sum_.comm_bound_seconds});
  sum_.step_over_bound = bound > 0 ? sum_.step_seconds_median / bound : 0;
  return Status::Ok();
}

// Rank 0 writes what the run leaves; with the optimizer state partitioned every rank takes
// part in gathering the weights it saves.
Status TrainLoop::WriteOutputs() {
  const bool lead = run_.ranks.lead();
  if (!opt_.save_path.empty() && (lead || run_.eo.partition_optimizer)) {
    ZINF_RETURN_IF_ERROR(SaveWeights(ex_, opt_.save_path, lead));
  }
  if (!lead) return Status::Ok();
  if (!run_.trace_path.empty()) ZINF_RETURN_IF_ERROR(run_.tracer->Write(run_.trace_path));
  if (!opt_.summary_path.empty()) {
    std::ofstream out(opt_.summary_path, std::ios::trunc);
    out << sum_.ToJson() << "\n";
    if (!out) return IoError("write --summary-json file " + opt_.summary_path);
  }
  return Status::Ok();
}

}  // namespace zinf::train
