// `zinf train`: train the GPT-2 model of the config (or of the flags) with its state paged
// among the device, pinned host memory and NVMe. Without flags it runs the default job: a small
// model whose parameters and optimizer state live on NVMe under build/, about a minute here.
// One set of defaults: the default job's; a config file's keys replace them, flags replace both.
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <limits>
#include <unistd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "src/base/units.h"
#include "src/model/model_shape.h"
#include "src/train/trainer.h"
#include "tools/commands.h"
#include "tools/train_config.h"

namespace zinf::tools {
namespace {

std::atomic<bool> g_stop{false};

// The first SIGINT or SIGTERM asks for a stop; both go back to their default action, so a second
// one of either kills at once (signal() is async-signal-safe).
void OnInterrupt(int) {
  g_stop.store(true);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
}

// A finite number >= 0 (CLI::NonNegativeNumber's message would print DBL_MAX as its bound).
const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end == s.c_str() || *end != '\0' || !std::isfinite(v) || v < 0) {
        return "Value " + s + " is not a finite number >= 0";
      }
      return {};
    },
    "NONNEGATIVE");

// The trainer's options from the flags and the config.
train::TrainOptions TrainOptionsOf(const TrainArgs& a, const Config& config, DeviceKind kind) {
  train::TrainOptions o;
  o.config = config;
  o.steps = a.steps;
  o.data_path = a.data;
  o.val_data_path = a.val_data;
  // One of the four names: --data-format's check refused anything else.
  o.data_format = *train::ParseDataFormat(a.data_format);
  o.synthetic_bytes = a.synthetic_bytes;
  o.eval_every = a.eval_every;
  o.init_path = a.init;
  o.save_path = a.save;
  o.losses_path = a.losses;
  o.summary_path = a.summary;
  o.trace_path = a.trace;
  o.device = kind;
  o.placement = a.placement;
  o.h2d_gbps = a.h2d_gbps;
  o.profile = a.profile;
  o.stop = &g_stop;
  o.stop_after = a.stop_after;
  o.compare_checkpoint_copy = a.compare_checkpoint_copy;
  o.progress = [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  };
  return o;
}

// A resume runs to the total its checkpoint's run was asked for and reads the same data,
// unless flags say otherwise (the data is then checked against the checkpoint's).
Status ApplyResumedRun(const CLI::App& cmd, const train::RecordedRun& run,
                       train::TrainOptions& o) {
  const auto unset = [&](const char* flag) { return cmd.count(flag) == 0; };
  if (unset("--steps")) o.steps = run.steps_total;
  if (unset("--data") && unset("--val-data") && unset("--data-format") &&
      unset("--synthetic-bytes")) {
    o.data_path = run.data;
    o.val_data_path = run.val_data;
    ZINF_ASSIGN_OR_RETURN(o.data_format, train::ParseDataFormat(run.data_format));
    o.synthetic_bytes = run.synthetic_bytes;
    o.val_fraction = run.val_fraction;
    o.eval_batches = run.eval_batches;
  }
  if (unset("--eval-every")) o.eval_every = run.eval_every;
  return Status::Ok();
}

// The run's summary, as rank 0 prints it.
void PrintTrainSummary(const train::TrainSummary& s) {
  fmt::print("done: {} steps ({} skipped), loss {:.4f} -> {:.4f}{}, {:.0f} tokens/s, median step "
             "{:.3f} s, stall {:.1f}%\n",
             s.steps, s.skipped_steps, s.first_loss, s.final_loss,
             s.val_loss >= 0 ? fmt::format(" (validation {:.4f})", s.val_loss) : "",
             s.tokens_per_s, s.step_seconds_median, 100 * s.stall_fraction);
  fmt::print("      {} parameters on {} ({} backend, I/O {}); NVMe read {} written {}; peak device "
             "{} of {}, peak pinned {} of {}; peak RSS {}\n",
             s.params, s.device, s.backend, s.io_engine, FormatBytesHuman(s.nvme_read_bytes),
             FormatBytesHuman(s.nvme_write_bytes), FormatBytesHuman(s.peak_device_bytes),
             FormatBytesHuman(s.device_budget_bytes), FormatBytesHuman(s.peak_pinned_bytes),
             FormatBytesHuman(s.pinned_budget_bytes), FormatBytesHuman(s.peak_rss_bytes));
  if (s.optimizer_state_memory_bytes > 0 && s.optimizer_state_nvme_bytes > 0) {
    fmt::print("      optimizer state: {}\n", s.placement);
  }
  if (s.plan_nvme_read_bytes_per_step > 0 || s.plan_nvme_write_bytes_per_step > 0) {
    fmt::print("      NVMe a step (median): read {} written {}; zinf plan predicted {} and {}\n",
               FormatBytesHuman(static_cast<uint64_t>(s.nvme_read_bytes_step_median)),
               FormatBytesHuman(static_cast<uint64_t>(s.nvme_write_bytes_step_median)),
               FormatBytesHuman(static_cast<uint64_t>(s.plan_nvme_read_bytes_per_step)),
               FormatBytesHuman(static_cast<uint64_t>(s.plan_nvme_write_bytes_per_step)));
  }
  fmt::print("      link a step (median): to the device {} back {}; zinf plan predicted {} and {}\n",
             FormatBytesHuman(static_cast<uint64_t>(s.h2d_bytes_step_median)),
             FormatBytesHuman(static_cast<uint64_t>(s.d2h_bytes_step_median)),
             FormatBytesHuman(static_cast<uint64_t>(s.plan_h2d_bytes_per_step)),
             FormatBytesHuman(static_cast<uint64_t>(s.plan_d2h_bytes_per_step)));
  if (s.world > 1) {
    fmt::print("      {} ranks over {}: {} sent and {} received per step and rank ({} sent "
               "for the gradients), {:.3f} s a step in the gradients' and weights' collectives\n",
               s.world, s.transport, FormatBytesHuman(uint64_t(s.comm_sent_bytes_per_step)),
               FormatBytesHuman(uint64_t(s.comm_received_bytes_per_step)),
               FormatBytesHuman(uint64_t(s.grad_comm_sent_bytes_per_step)), s.comm_seconds);
  }
  if (s.step_over_bound > 0) {
    fmt::print("profile: compute {:.3f} s | NVMe I/O {:.3f} s | Adam {:.3f} s{} (each alone) | "
               "step {:.3f} s = {:.3f} x the largest\n",
               s.compute_bound_seconds, s.io_bound_seconds, s.adam_bound_seconds,
               s.world > 1 ? fmt::format(" | collectives {:.3f} s", s.comm_bound_seconds) : "",
               s.step_seconds_median, s.step_over_bound);
    fmt::print("         per step in the run: compute {:.3f} s, waiting for weights {:.3f} s "
               "({:.3f} s of it for the optimizer's), gradient hand-over {:.3f} s, optimizer "
               "{:.3f} s (Adam {:.3f} s of it)\n",
               s.compute_seconds, s.stall_seconds, s.optimizer_wait_seconds, s.grad_seconds,
               s.optimizer_seconds, s.adam_seconds);
  }
  if (s.checkpoints > 0) {
    fmt::print("      checkpoints: {} committed, the last {}{}\n", s.checkpoints, s.last_checkpoint,
               s.resumed_from_step > 0 ? fmt::format(" (resumed from step {})", s.resumed_from_step)
                                       : "");
  }
  if (s.plain_copies > 0) {
    const double base = s.other_step_seconds_median;
    fmt::print(
        "      checkpoint cost: the steps a commit overlapped took {:.3f} s (median; the others "
        "{:.3f} s{}); the writer thread {:.3f} s a commit; a plain copy of the same {} took "
        "{:.3f} s a checkpoint\n",
        s.checkpoint_step_seconds_median, base,
        base > 0 ? fmt::format(", {:+.1f}%", 100 * (s.checkpoint_step_seconds_median / base - 1))
                 : "",
        s.checkpoint_writer_seconds / static_cast<double>(s.checkpoints),
        FormatBytesHuman(s.plain_copy_bytes / s.plain_copies),
        s.plain_copy_seconds / static_cast<double>(s.plain_copies));
  }
}

int RunTrain(const CLI::App& cmd, const TrainArgs& a) {
  auto cfg = BuildTrainConfig(cmd, a);
  if (!cfg.ok()) {
    fmt::print(stderr, "zinf train: {}\n", cfg.status().ToString());
    return 2;
  }
  if (a.print_config) {
    fmt::print("{}", cfg->sources.Annotate(cfg->config));
    return 0;
  }
  auto kind = ParseDeviceKind(a.device);
  if (!kind.ok()) {
    fmt::print(stderr, "zinf train: --device: {}\n", kind.status().ToString());
    return 2;
  }
  if (Status s = PrepareSwapDirs(cfg->config); !s.ok()) {
    fmt::print(stderr, "zinf train: {}\n", s.ToString());
    return 2;
  }
  train::TrainOptions o = TrainOptionsOf(a, cfg->config, *kind);
  if (const auto& run = cfg->resumed_run) {
    if (Status s = ApplyResumedRun(cmd, *run, o); !s.ok()) {
      fmt::print(stderr, "zinf train: --resume: {}\n", s.ToString());
      return 2;
    }
  }
  // SIGINT (Ctrl-C) and SIGTERM end the current step, commit a checkpoint when
  // zinf.checkpoint.dir is set, and exit; a second signal kills at once (the last committed
  // checkpoint stays intact).
  struct sigaction sa {};
  sa.sa_handler = OnInterrupt;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  auto r = train::Train(o);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  if (!r.ok()) {
    fmt::print(stderr, "zinf train: {}\n", r.status().ToString());
    return 1;
  }
  const train::TrainSummary& s = *r;
  if (s.rank != 0) return 0;  // across ranks, rank 0 reports for the job
  PrintTrainSummary(s);
  // Stopped by a signal: 0 when the state is kept in a checkpoint, else 130 (as an interrupt).
  return s.stopped && s.checkpoints == 0 ? 130 : 0;
}

// The config, the run's length and its data.
void AddDataFlags(CLI::App* cmd, TrainArgs* a) {
  cmd->add_option("--config", a->config,
                  "JSON config (DeepSpeed keys + zinf block): its keys replace the default job's, "
                  "flags replace both")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--strict", a->strict, "Refuse DeepSpeed keys zinf does not implement");
  // The flags' ranges are those config_schema.cc enforces on a file's keys: Config::Validate
  // checks only cross-field rules, so an override out of range would otherwise get through
  // (--grad-accum 0 trained nothing and exited 0) or fail later without naming the flag.
  cmd->add_option("--steps", a->steps, "Optimizer steps")
      ->capture_default_str()
      ->check(CLI::Range(uint64_t{1}, std::numeric_limits<uint64_t>::max()));
  auto* data = cmd->add_option(
      "--data", a->data,
      "Training tokens: a text file (bytes are tokens), a nanoGPT .bin (uint16 tokens) or an "
      "llm.c token file (see --data-format); the last 10% held out unless --val-data (default: "
      "the built-in synthetic arithmetic corpus)");
  data->check(CLI::ExistingFile);
  cmd->add_option("--val-data", a->val_data,
                  "Validation tokens for --eval-every, in the same formats; the --data file then "
                  "trains whole")
      ->check(CLI::ExistingFile)
      ->needs(data);
  cmd->add_option("--data-format", a->data_format,
                  "Format of --data and --val-data: text, nanogpt, llmc or auto (llmc when the "
                  "file starts with llm.c's magic 20240520, nanogpt when its name ends in .bin, "
                  "else text)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "text", "nanogpt", "llmc"}))
      ->needs(data);
  cmd->add_option("--synthetic-bytes", a->synthetic_bytes, "Size of the synthetic corpus")
      ->capture_default_str();
}

// The model, the batch, the optimizer and the offload.
void AddModelFlags(CLI::App* cmd, TrainArgs* a) {
  cmd->add_option("--arch", a->arch, "zinf.model.arch")
      ->check(CLI::IsMember({"gpt2", "llama"}));
  cmd->add_option("--preset", a->preset,
                  fmt::format("A published model's shape by name ({}): every zinf.model key left "
                              "at its default takes the preset's; one given must agree. Weights "
                              "are initialized at random unless --init",
                              fmt::join(model::PresetNames(), ", ")));
  cmd->add_option("--layers", a->layers, "zinf.model.layers")->check(CLI::Range(1u, 4096u));
  cmd->add_option("--width", a->width, "zinf.model.width")->check(CLI::Range(1u, 65536u));
  cmd->add_option("--heads", a->heads, "zinf.model.heads")->check(CLI::Range(1u, 1024u));
  cmd->add_option("--seq-len", a->seq_len, "zinf.model.seq_len")->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--vocab", a->vocab, "zinf.model.vocab")->check(CLI::Range(2u, 1u << 24));
  cmd->add_option("--kv-heads", a->kv_heads, "zinf.model.kv_heads (arch llama)")
      ->check(CLI::Range(1u, 1024u));
  cmd->add_option("--intermediate", a->intermediate, "zinf.model.intermediate (arch llama)")
      ->check(CLI::Range(1u, 1u << 20));
  cmd->add_option("--batch", a->batch, "train_micro_batch_size_per_gpu")
      ->check(CLI::Range(1u, std::numeric_limits<uint32_t>::max()));
  cmd->add_option("--grad-accum", a->accum, "gradient_accumulation_steps")
      ->check(CLI::Range(1u, std::numeric_limits<uint32_t>::max()));
  cmd->add_option("--lr", a->lr, "optimizer.params.lr")->check(kNonNegative);
  cmd->add_option("--schedule", a->schedule,
                  "Learning-rate schedule: constant (no scheduler), warmup (WarmupLR), cosine "
                  "(WarmupCosineLR) or decay (WarmupDecayLR); its parameters stay the config's "
                  "(default: cosine, 10 linear warm-up steps from 0)")
      ->check(CLI::IsMember({"constant", "warmup", "cosine", "decay"}));
  cmd->add_option("--clip", a->clip, "gradient_clipping (0 = off)")->check(kNonNegative);
  cmd->add_option("--seed", a->seed, "zinf.seed: weights and data");
  cmd->add_option("--precision", a->precision, "bf16 or fp16 (dynamic loss scaling)")
      ->check(CLI::IsMember({"bf16", "fp16"}));
  cmd->add_option("--offload", a->offload, "Where parameters and optimizer state live: nvme, cpu or none")
      ->check(CLI::IsMember({"nvme", "cpu", "none"}));
}

// The device, the budgets and placement, and the files the run writes.
void AddPlacementFlags(CLI::App* cmd, TrainArgs* a) {
  cmd->add_option("--swap-dir", a->swap_dir, "Directory for the swap file (NVMe offload)");
  cmd->add_option("--device", a->device, "auto, host or cuda")->capture_default_str();
  cmd->add_option("--device-budget", a->device_budget, "zinf.budgets.device_bytes, e.g. 512M, or auto");
  cmd->add_option("--pinned-budget", a->pinned_budget, "zinf.budgets.pinned_bytes, e.g. 4G, or auto (what the run wants, within what the machine allows)");
  cmd->add_option("--host-budget", a->host_budget,
                  "zinf.budgets.host_bytes, e.g. 12G, or auto (the memory available less the "
                  "pinned and device budgets and 2 GiB, in whole GiB): plain host memory for "
                  "optimizer state (with --offload nvme, --placement auto keeps the units that "
                  "fit there)");
  cmd->add_option("--placement", a->placement,
                  "Where each unit's optimizer state lives with --offload nvme: auto (the units "
                  "that fit in zinf.budgets.host_bytes in memory, the rest on NVMe), nvme (all "
                  "of it), or a JSON file {\"optimizer_state\": {\"block3\": \"memory\", ...}}")
      ->capture_default_str();
  cmd->add_option("--h2d-gbps", a->h2d_gbps, "Host-emulated device: link GB/s (0 = memcpy)");
  cmd->add_option("--eval-every", a->eval_every, "Validation loss every N steps and at the end");
  cmd->add_option("--init", a->init,
                  "Start from these weights (safetensors); the model's sizes are those the file "
                  "records (a file or flag that disagrees is refused)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--save", a->save, "Write the final fp32 weights (safetensors)");
  cmd->add_option("--losses", a->losses, "Write each step's loss as JSON lines");
  cmd->add_option("--summary-json", a->summary, "Write the run's summary as one JSON object");
  cmd->add_option("--trace", a->trace, "Write a Chrome trace-event JSON");
}

// The optimizer state, the collectives, checkpoints and profiling.
void AddStateAndCheckpointFlags(CLI::App* cmd, TrainArgs* a) {
  cmd->add_option("--optimizer-state-dtype", a->state_dtype,
                  "zinf.optimizer_state_dtype: the Adam moments' storage, fp32 or bf16 (8 instead "
                  "of 12 bytes a parameter of optimizer state)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  cmd->add_option("--optimizer-state-rounding", a->state_rounding,
                  "zinf.optimizer_state_rounding: how bf16 moments are rounded, stochastic "
                  "(unbiased, deterministic from zinf.seed) or nearest")
      ->check(CLI::IsMember({"stochastic", "nearest"}));
  cmd->add_flag("--overlap-adam", a->overlap_adam,
                "zinf.overlap_adam: each unit's Adam during backward (clipping with the previous "
                "step's coefficient)");
  cmd->add_option("--comm-timeout", a->comm_timeout,
                  "zinf.comm.timeout_seconds: across ranks, a rank silent this long fails the "
                  "others, named")
      ->check(CLI::Range(1, 86400));
  cmd->add_option("--checkpoint-dir", a->checkpoint_dir,
                  "zinf.checkpoint.dir: write crash-consistent checkpoints under DIR (at the end, "
                  "every --checkpoint-every steps, and on SIGINT/SIGTERM)");
  cmd->add_option("--checkpoint-every", a->checkpoint_every,
                  "zinf.checkpoint.every: a checkpoint every N steps (0: only at the end)")
      ->check(CLI::Range(uint64_t{0}, std::numeric_limits<uint64_t>::max()));
  cmd->add_option("--keep-checkpoints", a->keep_checkpoints,
                  "zinf.checkpoint.keep: committed checkpoints kept (older ones deleted once a "
                  "newer one is committed; with the optimizer state on NVMe, at most 63, each "
                  "one 12 bytes a parameter of swap file)")
      ->check(CLI::Range(1u, 1000u));
  cmd->add_option("--resume", a->resume,
                  "zinf.checkpoint.resume: continue from a checkpoint directory, or the latest "
                  "committed one under DIR; its run's config is the base, --steps defaults to "
                  "its total");
  cmd->add_option("--stop-after", a->stop_after,
                  "Stop after step N of --steps as SIGTERM does (checkpoint, exit 0): a job "
                  "that runs part of a schedule and is resumed later");
  cmd->add_flag("--compare-checkpoint-copy", a->compare_checkpoint_copy,
                "Benchmark: after each checkpoint's commit, time a plain copy of its bytes "
                "between steps, and print both");
  cmd->add_flag("--verify-state-reads", a->verify_state_reads,
                "zinf.checkpoint.verify_state_reads: check the xxHash64 of the optimizer state "
                "on every read from NVMe");
  cmd->add_flag("--print-config", a->print_config,
                "Print the merged config (the default job's, then --config, then the flags) as "
                "JSON, each value with where it came from, and exit without training");
  cmd->add_flag("--profile", a->profile,
                "Also measure compute, NVMe I/O and Adam alone and print the step over the largest");
}

}  // namespace

void AddTrainFlags(CLI::App* cmd, TrainArgs* a) {
  AddDataFlags(cmd, a);
  AddModelFlags(cmd, a);
  AddPlacementFlags(cmd, a);
  AddStateAndCheckpointFlags(cmd, a);
}

void RegisterTrain(CLI::App& app, int& exit_code) {
  auto a = std::make_shared<TrainArgs>();
  auto* cmd = app.add_subcommand(
      "train", "Train a GPT-2 model with its state paged among device, pinned host memory and "
               "NVMe (defaults: a small model on NVMe under build/, about a minute)");
  AddTrainFlags(cmd, a.get());
  cmd->callback([a, cmd, &exit_code] { exit_code = RunTrain(*cmd, *a); });
}

}  // namespace zinf::tools
