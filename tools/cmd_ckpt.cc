// `zinf ckpt inspect|verify|export`: read a checkpoint `zinf train` (or zinf.torch) wrote
// (src/train/checkpoint_export.h). DIR is a checkpoint directory, or a checkpoint root (its
// latest committed checkpoint). Exit 0 on success, 1 when the checkpoint is bad or cannot be
// read (the error names the shard, file and offset), 2 on bad usage.
#include <chrono>
#include <string>

#include <fmt/format.h>

#include "src/base/host_info.h"
#include "src/base/units.h"
#include "src/ckpt/manifest.h"
#include "src/train/checkpoint_export.h"
#include "tools/commands.h"

namespace zinf::tools {
namespace {

struct CkptArgs {
  std::string dir, out, dtype = "fp32";
  bool optimizer_state = false, no_verify = false;
};

Result<ckpt::Manifest> Open(const std::string& dir) {
  ZINF_ASSIGN_OR_RETURN(std::string resolved, ckpt::Resolve(dir));
  return ckpt::Read(resolved);
}

int Fail(const char* what, const Status& s) {
  fmt::print(stderr, "zinf ckpt {}: {}\n", what, s.ToString());
  return 1;
}

int Inspect(const CkptArgs& a) {
  auto m = Open(a.dir);
  if (!m.ok()) return Fail("inspect", m.status());
  auto text = train::Describe(*m);
  if (!text.ok()) return Fail("inspect", text.status());
  fmt::print("{}", *text);
  return 0;
}

int Verify(const CkptArgs& a) {
  const auto t0 = std::chrono::steady_clock::now();
  auto m = Open(a.dir);
  if (!m.ok()) return Fail("verify", m.status());
  uint64_t shards = 0, bytes = 0;
  Status s = ckpt::Verify(*m, [&](const ckpt::ShardEntry& e) {
    ++shards;
    bytes += e.length;
  });
  if (!s.ok()) return Fail("verify", s);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("ok: {} ({}): {} shards, {} verified in {:.2f} s\n", m->dir,
             fmt::format("step {}", m->step), shards, FormatBytesHuman(bytes), secs);
  return 0;
}

int Export(const CkptArgs& a) {
  auto m = Open(a.dir);
  if (!m.ok()) return Fail("export", m.status());
  train::ExportOptions o{.out = a.out,
                         .dtype = a.dtype == "bf16" ? train::Dtype::kBF16 : train::Dtype::kF32,
                         .optimizer_state = a.optimizer_state,
                         .verify = !a.no_verify};
  auto st = train::Export(*m, o);
  if (!st.ok()) return Fail("export", st.status());
  fmt::print("exported {} (step {}) to {}: {} tensors, {}; verified in {:.2f} s, written in "
             "{:.2f} s; peak RSS {}\n",
             m->dir, m->step, a.out, st->tensors, FormatBytesHuman(st->bytes), st->verify_seconds,
             st->write_seconds, FormatBytesHuman(PeakRssBytes()));
  return 0;
}

}  // namespace

void RegisterCkpt(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand(
      "ckpt", "Inspect, verify or export a checkpoint of zinf train or of zinf.torch");
  cmd->require_subcommand(1);
  auto a = std::make_shared<CkptArgs>();
  const char* dir_help =
      "A checkpoint directory, or a checkpoint root (its latest committed checkpoint)";

  auto* inspect = cmd->add_subcommand("inspect", "What it holds: step, model, bytes per role and tier");
  inspect->add_option("dir", a->dir, dir_help)->required();
  inspect->callback([a, &exit_code] { exit_code = Inspect(*a); });

  auto* verify = cmd->add_subcommand("verify", "Check every shard's xxHash64 (exit 1 naming the first bad one)");
  verify->add_option("dir", a->dir, dir_help)->required();
  verify->callback([a, &exit_code] { exit_code = Verify(*a); });

  auto* exp = cmd->add_subcommand(
      "export", "Write the weights (and the Adam moments) as one safetensors file with nanoGPT's "
                "names (a zinf.torch checkpoint: the module's own)");
  exp->add_option("dir", a->dir, dir_help)->required();
  exp->add_option("--out", a->out, "The safetensors file to write")->required();
  exp->add_option("--dtype", a->dtype, "Of the weights: fp32 or bf16 (moments stay fp32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  exp->add_flag("--optimizer-state", a->optimizer_state,
                "Also each weight's exp_avg and exp_avg_sq, as <name>.exp_avg and <name>.exp_avg_sq");
  exp->add_flag("--no-verify", a->no_verify, "Skip checking every shard's hash first");
  exp->callback([a, &exit_code] { exit_code = Export(*a); });
}

}  // namespace zinf::tools
