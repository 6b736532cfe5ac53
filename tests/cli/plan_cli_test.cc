// `zinf plan` end to end on the tiny model: the bytes it predicts per tier and role, and the
// NVMe bytes a step moves, against what `zinf train` with the same flags then measures, for
// several placements and a pinned budget too small to cache every 16-bit weight and gradient;
// given rates give the step time by the stated formula; a model that cannot fit is refused with
// the numbers and what would make it fit; the same refusals as zinf train for bad placements.
#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/cli/cli_util.h"
#include "tests/cli/rank_cli_util.h"
#include "tests/cli/train_cli_util.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using namespace zinf::testing::train_cli;
using testing::RunZinf;
using testing::TempDir;

// Given rates (a link of 100 GB/s unless the flags name one: no pass is the link's).
nlohmann::json Plan(const TempDir& dir, const std::string& flags) {
  const bool link = flags.find("--link-gbps") != std::string::npos ||
                    flags.find("--h2d-gbps") != std::string::npos;
  auto r = RunZinf("plan " + flags + " --json --read-gbps 0.5 --write-gbps 0.25 --adam-ns 2" +
                       " --compute-seconds 0.01" + (link ? "" : " --link-gbps 100"),
                   dir.path());
  EXPECT_EQ(r.exit_code, 0) << flags << "\n" << r.err;
  return nlohmann::json::parse(r.out, nullptr, false);
}

TEST(PlanCliTest, PredictsTheBytesARunThenMeasures) {
  TempDir dir;
  std::ofstream(dir / "file.json") << R"({"optimizer_state": {"embedding": "memory"}})";
  std::ofstream(dir / "small_aio.json") << R"({"aio": {"block_size": "128K"}})";
  // 4M blocks: more than the tiny model's pinned wants (its slabs and shards), so an automatic
  // budget (--pinned-budget auto) is one block, in the plan as in the run.
  std::ofstream(dir / "big_aio.json") << R"({"aio": {"block_size": "4M"}})";
  struct Case {
    std::string name, flags;
  };
  // The last two: 640K / 680K pinned (with 128K I/O blocks) leave 32 / 72 KiB of cache for
  // 110 KiB of 16-bit weights and gradients: the shortfall is read back every step.
  const std::vector<Case> cases = {
      {"nvme", " --placement nvme"},
      {"auto", " --host-budget 160K"},
      {"file", " --placement " + dir / "file.json"},
      {"bf16", " --optimizer-state-dtype bf16 --host-budget 100K"},
      {"short_pinned", " --pinned-budget 640K --config " + dir / "small_aio.json"},
      {"shorter_pinned", " --pinned-budget 680K --config " + dir / "small_aio.json"},
      {"auto_pinned", " --pinned-budget auto --config " + dir / "big_aio.json"},
      {"overlap", " --overlap-adam --host-budget 100K"},
  };
  for (const Case& c : cases) {
    std::string flags = TinyNvme(6, dir) + c.flags;
    if (c.flags.find("--pinned-budget") != std::string::npos) {  // in place of the tiny one's
      flags.replace(flags.find("--pinned-budget 16M"), 19, "");
    }
    const nlohmann::json plan = Plan(dir, flags.substr(std::string("train").size()));
    ASSERT_FALSE(plan.is_discarded()) << c.name;
    const std::string summary = dir / (c.name + ".json");
    auto r = RunZinf(flags + " --summary-json " + summary, dir.path());
    ASSERT_EQ(r.exit_code, 0) << c.name << r.err;
    const nlohmann::json s = ReadJson(summary);
    EXPECT_EQ(plan["bytes"]["host"]["optimizer_state"], s["optimizer_state_memory_bytes"])
        << c.name;
    EXPECT_EQ(plan["bytes"]["pinned"]["budget"], s["pinned_budget_bytes"]) << c.name;
    EXPECT_EQ(plan["bytes"]["nvme"]["optimizer_state"], s["optimizer_state_nvme_bytes"]) << c.name;
    EXPECT_EQ(plan["bytes"]["nvme"]["param16_derived_from_memory"], s["param16_derived_bytes"])
        << c.name;
    EXPECT_EQ(plan["bytes"]["nvme"]["param16"].get<uint64_t>(),
              s["param16_bytes"].get<uint64_t>() - s["param16_derived_bytes"].get<uint64_t>())
        << c.name;
    EXPECT_EQ(plan["bytes"]["nvme"]["gradients"], s["gradient_bytes"]) << c.name;
    // A step's NVMe bytes: the model counts bytes, the engine moves whole 4 KiB blocks (each of
    // the 4 units' up to 4 extents a step rounds up by less than a block).
    const double slack = 4 * 4 * 4096;
    const double read = s["nvme_read_bytes_step_median"], write = s["nvme_write_bytes_step_median"];
    EXPECT_NEAR(plan["nvme_read_bytes_per_step"].get<double>(), read, slack)
        << c.name << r.out;
    EXPECT_NEAR(plan["nvme_write_bytes_per_step"].get<double>(), write, slack) << c.name;
    // The run reports the same prediction beside what it measured.
    EXPECT_EQ(s["plan_nvme_read_bytes_per_step"], plan["nvme_read_bytes_per_step"]) << c.name;
    EXPECT_NE(r.out.find("zinf plan predicted"), std::string::npos) << r.out;
    // The time by the formula: the optimizer step (its I/O at the given rates, or Adam) under a
    // quarter of the compute, the rest of the compute after it; every NVMe byte a floor.
    const double state = plan["bytes"]["nvme"]["optimizer_state"].get<double>();
    // The first 3 units' state (pipeline_depth 2) is read during backward, outside the step;
    // with overlap_adam the whole optimizer step runs beside backward (3/4 of the compute).
    const bool overlap = c.name == "overlap";
    const double ahead = plan["optimizer_state_read_under_backward_bytes"].get<double>();
    if (overlap) {
      EXPECT_EQ(ahead, 0);
    } else {
      EXPECT_GT(ahead, 0) << c.name;
      EXPECT_LE(ahead, state) << c.name;
    }
    const double opt = std::max((state - ahead) / 0.5e9 + (state + 2.0 * kParams) / 0.25e9,
                                2e-9 * static_cast<double>(kParams));
    const double nvme = plan["nvme_read_bytes_per_step"].get<double>() / 0.5e9 +
                        plan["nvme_write_bytes_per_step"].get<double>() / 0.25e9;
    const double hidden = overlap ? 0.0075 : 0.0025;
    const double step = std::max(0.01 - hidden + std::max(hidden, opt), nvme);
    // (The link at the 100 GB/s given adds under a microsecond: a block's share of it.)
    EXPECT_NEAR(plan["seconds"]["step"].get<double>(), step, 1e-6) << c.name;
  }
}

// The link: the 16-bit weights fetched to the device a step (all of them in the first forward,
// then each pass what the device cache did not keep, in whole units) and the 16-bit gradients
// handed back, against a run's median step, for device budgets from the least the executor
// accepts to room for every unit, with accumulation and with the state on NVMe.
TEST(PlanCliTest, PredictsTheLinkBytesARunThenMeasures) {
  TempDir dir;
  const std::string model = "train --layers 6 --width 32 --heads 4 --seq-len 16 "
                            "--batch 4 --steps 6 --pinned-budget 16M --synthetic-bytes 65536";
  struct Case {
    std::string name;
    uint64_t cache;
    std::string extra;
    double refetched_units;  // a block's 16-bit weights (6 blocks, 12704 parameters each)
  };
  // The last: an embedding 5x a block (vocab 2048), the cache short of a block's worth.
  const std::vector<Case> cases = {
      {"least", 64000, " --vocab 64 --offload cpu", 4},
      {"some", 100000, " --vocab 64 --offload cpu", 3},
      {"more", 140000, " --vocab 64 --offload cpu", 1},
      {"all", 160000, " --vocab 64 --offload cpu", 0},
      {"accum", 100000, " --vocab 64 --offload cpu --grad-accum 2", 3},
      {"nvme", 100000, " --vocab 64 --offload nvme --swap-dir " + dir / "swap", 3},
      {"big_embedding", 260000, " --vocab 2048 --offload cpu", 1},
  };
  for (const Case& c : cases) {
    // The executor's device buffers: the budget less the plan's cache for 16-bit weights.
    const nlohmann::json probe =
        Plan(dir, model.substr(5) + c.extra + " --device-budget 4M --link-gbps 1");
    ASSERT_FALSE(probe.is_discarded()) << c.name;
    const uint64_t reserved = probe["bytes"]["device"]["budget"].get<uint64_t>() -
                              probe["bytes"]["device"]["cache"].get<uint64_t>();
    const double all16 = 2.0 * probe["params"].get<double>();
    const std::string flags =
        model + c.extra + " --device-budget " + std::to_string(reserved + c.cache);
    const nlohmann::json plan = Plan(dir, flags.substr(5) + " --link-gbps 1");
    ASSERT_FALSE(plan.is_discarded()) << c.name;
    const std::string summary = dir / (c.name + ".json");
    auto r = RunZinf(flags + " --summary-json " + summary, dir.path());
    ASSERT_EQ(r.exit_code, 0) << c.name << r.err;
    const nlohmann::json s = ReadJson(summary);
    const double mbs = c.extra.find("--grad-accum 2") != std::string::npos ? 2 : 1;
    const double block16 = 2.0 * (12 * 32 * 32 + 13 * 32);
    EXPECT_EQ(plan["h2d_bytes_per_step"].get<double>(),
              all16 + (2 * mbs - 1) * c.refetched_units * block16)
        << c.name;
    EXPECT_EQ(plan["d2h_bytes_per_step"].get<double>(), mbs * all16) << c.name;
    // The model counts what the cache keeps when each fetch comes just before its use; a
    // prefetch issued early (the machine busy elsewhere) can evict a unit still wanted at the
    // least budgets (seen: 2 blocks and the embedding more a step), never fewer fetches; and
    // the slot classes round the cache (seen: a block more with the big embedding). A
    // step's count ends when it returns, and a prefetch for the next step can land before
    // that: the median of 6 steps absorbs one such step.
    const double h2d = s["h2d_bytes_step_median"];
    EXPECT_LE(plan["h2d_bytes_per_step"].get<double>(), h2d) << c.name << r.out;
    EXPECT_LE(h2d, plan["h2d_bytes_per_step"].get<double>() + 3 * block16) << c.name << r.out;
    EXPECT_EQ(plan["d2h_bytes_per_step"], s["d2h_bytes_step_median"]) << c.name;
    EXPECT_EQ(s["plan_h2d_bytes_per_step"], plan["h2d_bytes_per_step"]) << c.name;
    EXPECT_EQ(s["plan_d2h_bytes_per_step"], plan["d2h_bytes_per_step"]) << c.name;
  }
}

// The link's time, pass by pass: the first forward fetches every 16-bit weight, the backward
// hands every gradient back (the link is full duplex: the larger direction), each pass the
// larger of its compute (a quarter forward, the rest backward) and its transfers. On the
// host-emulated device --h2d-gbps is the link's rate.
TEST(PlanCliTest, TheLinkBoundsEachPass) {
  TempDir dir;
  // The host-emulated device (its compute shares the CPU with Adam: nothing hides Adam), also
  // where a GPU answers.
  const std::string flags = Tiny(3).substr(5) + " --offload cpu --device host";
  const double all16 = 2.0 * static_cast<double>(kParams);
  // Slow: 0.0005 GB/s moves the 16-bit weights in about 0.1 s, against 0.01 s of compute.
  const nlohmann::json slow = Plan(dir, flags + " --link-gbps 0.0005");
  ASSERT_FALSE(slow.is_discarded());
  const double adam = slow["seconds"]["adam"];
  // Each pass also a block's share (2 blocks) of its compute: the pipeline's fill.
  const double fwd = all16 / 0.5e6 + 0.0025 / 2, bwd = all16 / 0.5e6 + 0.0075 / 2;
  EXPECT_NEAR(slow["seconds"]["compute_with_link"].get<double>(), fwd + bwd, 1e-12);
  EXPECT_NEAR(slow["seconds"]["link"].get<double>(), 2 * all16 / 0.5e6, 1e-12);
  EXPECT_NEAR(slow["seconds"]["step"].get<double>(), fwd + bwd + adam, 1e-12);
  EXPECT_EQ(slow["bound"], "link + Adam");
  EXPECT_EQ(slow["rates"]["link_h2d_gbps"], 0.0005);
  // The emulated link's rate, given to zinf train as --h2d-gbps, is the plan's too.
  const nlohmann::json paced = Plan(dir, flags + " --h2d-gbps 0.0005");
  ASSERT_FALSE(paced.is_discarded());
  EXPECT_EQ(paced["rates"]["link_d2h_gbps"], 0.0005);
  EXPECT_EQ(paced["seconds"]["step"], slow["seconds"]["step"]);
  // Fast: the compute bounds every pass.
  const nlohmann::json fast = Plan(dir, flags + " --link-gbps 100");
  ASSERT_FALSE(fast.is_discarded());
  EXPECT_NEAR(fast["seconds"]["compute_with_link"].get<double>(), 0.01 + 2 * all16 / 100e9 / 2,
              1e-12);
  EXPECT_EQ(fast["bound"], "compute + Adam");
}

// --world N: rank 0's share by the ZeRO stage (its chunks are the largest), against rank 0 of
// `zinf launch --nproc N` with the same flags: every byte it holds, its swap file, the NVMe
// bytes and the collectives' bytes a step.
TEST(PlanCliTest, PredictsRankZerosBytesAcrossRanks) {
  TempDir dir;
  struct Case {
    std::string name;
    int world, stage;
    std::string extra;
  };
  const std::vector<Case> cases = {
      {"z0cpu2", 2, 0, " --offload cpu"},
      {"z1nvme2", 2, 1, " --offload nvme"},
      {"z2cpu3", 3, 2, " --offload cpu"},
      {"z2nvme2_accum", 2, 2, " --offload nvme --grad-accum 2"},
      {"z3nvme3", 3, 3, " --offload nvme"},
      {"z3mixed2", 2, 3, " --offload nvme --host-budget 80K"},
      {"z3auto_pinned2", 2, 3, " --offload nvme --pinned-budget auto"},
  };
  for (const Case& c : cases) {
    const std::string config = dir / (c.name + ".json");
    std::ofstream(config) << R"({"zero_optimization": {"stage": )" << c.stage << "}}";
    std::string flags = Tiny(3) + c.extra + " --config " + config + " --swap-dir " +
                        dir / (c.name + "_swap");
    if (c.extra.find("--pinned-budget") != std::string::npos) {
      flags.replace(flags.find("--pinned-budget 16M"), 19, "");
    }
    const nlohmann::json plan =
        Plan(dir, flags.substr(std::string("train").size()) + " --world " +
                      std::to_string(c.world));
    ASSERT_FALSE(plan.is_discarded()) << c.name;
    EXPECT_EQ(plan["world"], c.world) << c.name;
    const std::string summary = dir / (c.name + ".json.summary");
    auto r = RunZinf(testing::ranks::Launch(c.world) + flags + " --summary-json " + summary,
                     dir.path());
    ASSERT_EQ(r.exit_code, 0) << c.name << r.out << r.err;
    const nlohmann::json s = ReadJson(summary);
    EXPECT_EQ(plan["bytes"]["host"]["optimizer_state"], s["optimizer_state_memory_bytes"])
        << c.name;
    EXPECT_EQ(plan["bytes"]["nvme"]["optimizer_state"], s["optimizer_state_nvme_bytes"])
        << c.name;
    EXPECT_EQ(plan["bytes"]["held"]["param16"], s["param16_bytes"]) << c.name;
    EXPECT_EQ(plan["bytes"]["held"]["gradients"], s["gradient_bytes"]) << c.name;
    EXPECT_EQ(plan["bytes"]["pinned"]["budget"], s["pinned_budget_bytes"]) << c.name;
    // The swap file is the size asked for, rounded up by the swap space (to 256 bytes here).
    const double swap_plan = plan["bytes"]["nvme"]["swap_file"], swap = s["swap_file_bytes"];
    EXPECT_LE(swap_plan, swap) << c.name;
    EXPECT_LT(swap, swap_plan + 4096) << c.name;
    const double slack = 4 * 4 * 4096;
    EXPECT_NEAR(plan["nvme_read_bytes_per_step"].get<double>(),
                s["nvme_read_bytes_step_median"].get<double>(), slack) << c.name;
    EXPECT_NEAR(plan["nvme_write_bytes_per_step"].get<double>(),
                s["nvme_write_bytes_step_median"].get<double>(), slack) << c.name;
    // The run reports rank 0's plan beside what it moved.
    if (c.extra.find("nvme") != std::string::npos) {
      EXPECT_EQ(s["plan_nvme_read_bytes_per_step"], plan["nvme_read_bytes_per_step"]) << c.name;
      EXPECT_EQ(s["plan_nvme_write_bytes_per_step"], plan["nvme_write_bytes_per_step"])
          << c.name;
    }
    // The link: every micro-batch's gradients handed back; ZeRO-3 copies every gathered unit
    // to the device in each pass, within the step. (The device tier's fetches of the other
    // stages are checked on one rank: a prefetch for the next step can land before a step's
    // count ends, which a median of 3 steps does not absorb.)
    EXPECT_EQ(plan["d2h_bytes_per_step"], s["d2h_bytes_step_median"]) << c.name;
    if (c.stage == 3) {
      EXPECT_EQ(plan["h2d_bytes_per_step"], s["h2d_bytes_step_median"]) << c.name;
    }
    // The collectives: the gradients' and weights' exactly, plus the step's few small ones
    // (the losses gathered, the ranks' agreements: a few hundred bytes).
    const double sent = s["comm_sent_bytes_per_step"];
    const double planned = plan["comm_sent_bytes_per_step"];
    EXPECT_LE(planned, sent) << c.name;
    EXPECT_LE(sent - planned, 1024) << c.name;
  }
}

// The time across ranks with the state on NVMe: ZeRO-1/2 step each unit's chunk after backward
// (the gather of its new weights is a collective), step = compute + optimizer step (its I/O and
// then Adam); ZeRO-3's step runs under the next forward, hidden by its first quarter of the
// compute. Neither reads state under backward (ZeRO's steps start after it).
TEST(PlanCliTest, AcrossRanksZero12StepAfterBackwardAndZero3UnderTheNextForward) {
  TempDir dir;
  for (int stage : {1, 2, 3}) {
    const std::string config = dir / ("s" + std::to_string(stage) + ".json");
    std::ofstream(config) << R"({"zero_optimization": {"stage": )" << stage << "}}";
    const std::string flags = Tiny(3) + " --offload nvme --config " + config + " --swap-dir " +
                              dir / "swap";
    const nlohmann::json plan = Plan(dir, flags.substr(std::string("train").size()) + " --world 2");
    ASSERT_FALSE(plan.is_discarded()) << stage;
    const double compute = plan["seconds"]["compute"], opt = plan["seconds"]["optimizer"];
    const double step = plan["seconds"]["step"];
    const double adam = plan["seconds"]["adam"];
    ASSERT_GT(opt, 0) << stage;
    ASSERT_GT(compute, 0) << stage;
    ASSERT_GT(adam, 0) << stage;
    EXPECT_EQ(plan["optimizer_state_read_under_backward_bytes"], 0.0) << "stage " << stage;
    if (stage < 3) {
      // The compute with the link (100 GB/s given: under a microsecond more).
      const double with_link = plan["seconds"]["compute_with_link"];
      EXPECT_LT(with_link - compute, 1e-5) << "stage " << stage;
      EXPECT_NEAR(step, with_link + opt, 1e-12) << "stage " << stage;
      EXPECT_GT(opt, adam) << "stage " << stage << ": its I/O and Adam add up";
    } else {
      // Its gathered units' copies to the device run in series with the compute (a few
      // microseconds at the 100 GB/s given).
      EXPECT_GT(plan["seconds"]["compute_with_link"].get<double>(), compute);
      EXPECT_NEAR(step, 0.75 * compute + std::max(0.25 * compute, opt), 1e-5);
    }
  }
}

TEST(PlanCliTest, AModelThatCannotFitIsRefusedWithWhatWouldFit) {
  TempDir dir;
  // 826 billion parameters: a swap file of about 15 TB.
  auto r = RunZinf("plan --layers 4096 --width 4096 --heads 16 --seq-len 16 --vocab 64 "
                   "--batch 1 --device-budget 2G --offload nvme --swap-dir " + dir / "swap" +
                       " --read-gbps 1 --write-gbps 1 --adam-ns 1 --compute-seconds 1",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("does not fit:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("the swap file needs"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("--optimizer-state-dtype bf16"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("zinf.stripe_paths"), std::string::npos) << r.out;
}

// State in memory with the 16-bit weights and gradients homed in pinned memory (--offload
// cpu): 800M parameters need 3.2 GB of it, more than a 1 GiB budget (zinf train refuses it too,
// mid-registration).
TEST(PlanCliTest, APinnedBudgetTooSmallForTheShardsHomedThereIsRefused) {
  TempDir dir;
  auto r = RunZinf("plan --layers 16 --width 2048 --heads 16 --seq-len 4 --vocab 256 --batch 1 "
                   "--offload cpu --pinned-budget 1G --device-budget 2G --adam-ns 1 "
                   "--compute-seconds 1",
                   dir.path());
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.out.find("zinf.budgets.pinned_bytes 1.0 GiB (1073741824 bytes) cannot hold"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("would fit with: --pinned-budget"), std::string::npos) << r.out;
}

TEST(PlanCliTest, BadPlacementsAreRefusedAsZinfTrainRefusesThem) {
  TempDir dir;
  std::ofstream(dir / "bad.json") << R"({"optimizer_state": {"block9": "memory"}})";
  auto r = RunZinf("plan --layers 2 --width 32 --heads 4 --seq-len 16 --vocab 64 --offload nvme "
                   "--swap-dir " + dir / "swap" + " --placement " + dir / "bad.json" +
                       " --read-gbps 1 --write-gbps 1 --adam-ns 1 --compute-seconds 1",
                   dir.path());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("optimizer_state.block9: no such unit"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace zinf
