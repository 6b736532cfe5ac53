// The trainer end to end (src/train/trainer.h) on the host-emulated device: offload changes
// nothing (resident vs NVMe under tiny budgets, bit for bit; GPT-2 and Llama), the loss falls on
// the synthetic corpus, weights round-trip through safetensors, fp16 with loss scaling trains, bad settings are
// refused with the field named.
#include "src/train/trainer.h"

#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/train/safetensors.h"
#include "tests/test_util.h"

namespace zinf::train {
namespace {

Config SmallModel() {
  Config c;
  c.zinf.model = {.layers = 3, .width = 32, .heads = 4, .seq_len = 16, .vocab = 64};
  c.train.train_micro_batch_size_per_gpu = 4;
  c.train.gradient_accumulation_steps = 2;
  c.train.gradient_clipping = 1.0;
  c.optimizer.lr = 3e-3;
  c.optimizer.weight_decay = 0.01;
  c.zinf.adam_threads = 2;
  c.zinf.budgets.pinned_bytes = 64 << 20;
  return c;
}

// Parameters and optimizer state homed on NVMe, budgets so small that every unit pages.
Config Offloaded(const std::string& dir) {
  Config c = SmallModel();
  c.zero.offload_param = {.device = OffloadDevice::kNvme, .nvme_path = dir};
  c.zero.offload_optimizer = {.device = OffloadDevice::kNvme, .nvme_path = dir};
  c.zinf.budgets.device_bytes = 600 << 10;
  c.zinf.budgets.pinned_bytes = 2 << 20;
  c.zinf.pipeline_depth = 1;
  return c;
}

std::vector<double> ReadLosses(const std::string& path) {
  std::vector<double> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line)["loss"].get<double>());
  return out;
}

std::map<std::string, std::vector<uint8_t>> ReadTensors(const std::string& path) {
  std::map<std::string, std::vector<uint8_t>> out;
  auto f = SafetensorsFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().ToString();
  if (!f.ok()) return out;
  for (const auto& t : f->tensors()) {
    std::vector<uint8_t> b(t.bytes());
    EXPECT_TRUE(f->Read(t.name, b.data(), b.size()).ok());
    out[t.name] = std::move(b);
  }
  return out;
}

TrainOptions Options(const Config& c, const std::string& dir, const std::string& tag,
                     uint64_t steps) {
  TrainOptions o;
  o.config = c;
  o.steps = steps;
  o.synthetic_bytes = 64 << 10;
  o.losses_path = dir + "/" + tag + ".losses";
  o.save_path = dir + "/" + tag + ".safetensors";
  o.device = DeviceKind::kHost;
  return o;
}

// With accumulation (fp32 gradient shards) and without (16-bit gradient shards).
class OffloadTest : public ::testing::TestWithParam<uint64_t> {};

TEST_P(OffloadTest, OffloadChangesNothingBitForBit) {
  zinf::testing::TempDir tmp;
  Config res = SmallModel(), off = Offloaded(tmp.path());
  res.train.gradient_accumulation_steps = off.train.gradient_accumulation_steps = GetParam();
  auto resident = Train(Options(res, tmp.path(), "resident", 4));
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  auto offloaded = Train(Options(off, tmp.path(), "offloaded", 4));
  ASSERT_TRUE(offloaded.ok()) << offloaded.status().ToString();
  // The offloaded run really paged: it read and wrote NVMe, and its peaks stayed in budget.
  EXPECT_EQ(resident->nvme_read_bytes, 0u);
  EXPECT_GT(offloaded->nvme_read_bytes, 0u);
  EXPECT_GT(offloaded->nvme_write_bytes, 0u);
  EXPECT_LE(offloaded->peak_device_bytes, offloaded->device_budget_bytes);
  EXPECT_LE(offloaded->peak_pinned_bytes, offloaded->pinned_budget_bytes);
  // Some of the optimizer's new weights went straight to the host tier, and still nothing
  // changed.
  EXPECT_GT(offloaded->param16_installs, 0u);
  const auto l1 = ReadLosses(tmp / "resident.losses"), l2 = ReadLosses(tmp / "offloaded.losses");
  ASSERT_EQ(l1.size(), 4u);
  EXPECT_EQ(l1, l2);  // bitwise: the JSON round-trips doubles exactly
  const auto w1 = ReadTensors(tmp / "resident.safetensors");
  const auto w2 = ReadTensors(tmp / "offloaded.safetensors");
  ASSERT_FALSE(w1.empty());
  EXPECT_EQ(w1.size(), w2.size());
  for (const auto& [name, bytes] : w1) {
    ASSERT_TRUE(w2.count(name)) << name;
    EXPECT_TRUE(bytes == w2.at(name)) << name << " differs";
  }
}

INSTANTIATE_TEST_SUITE_P(GradAccumulation, OffloadTest, ::testing::Values(1, 2),
                         [](const auto& info) { return fmt::format("gas{}", info.param); });

// Without clipping, updating each unit during backward gives the same bits as one optimizer
// step after it — on the in-memory optimizer and on the NVMe pipeline.
TEST(TrainerTest, OverlappedAdamMatchesTheStepAfterBackwardWithoutClipping) {
  zinf::testing::TempDir tmp;
  // 0: all in memory; 1: all on NVMe; 2: weights on NVMe, optimizer state in memory (new
  // param16 written home while the prefetcher may be reading it: a regression).
  for (int nvme : {0, 1, 2}) {
    Config c = nvme ? Offloaded(tmp.path()) : SmallModel();
    if (nvme == 2) c.zero.offload_optimizer = {};
    c.train.gradient_clipping = 0;
    auto plain = Train(Options(c, tmp.path(), "plain", 3));
    ASSERT_TRUE(plain.ok()) << plain.status().ToString();
    c.zinf.overlap_adam = true;
    auto overlapped = Train(Options(c, tmp.path(), "overlap", 3));
    ASSERT_TRUE(overlapped.ok()) << overlapped.status().ToString();
    EXPECT_EQ(ReadLosses(tmp / "plain.losses"), ReadLosses(tmp / "overlap.losses")) << nvme;
    EXPECT_TRUE(ReadTensors(tmp / "plain.safetensors") == ReadTensors(tmp / "overlap.safetensors"))
        << "nvme " << nvme;
  }
  Config bad = SmallModel();
  bad.zinf.overlap_adam = true;
  bad.fp16.enabled = true;
  auto refused = Train(Options(bad, tmp.path(), "bad", 1));
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("zinf.overlap_adam"), std::string::npos);
}

TEST(TrainerTest, LossFallsOnTheSyntheticCorpus) {
  zinf::testing::TempDir tmp;
  Config c = SmallModel();
  c.train.gradient_accumulation_steps = 1;
  c.train.train_micro_batch_size_per_gpu = 8;
  auto r = Train(Options(c, tmp.path(), "run", 60));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->steps, 60u);
  EXPECT_NEAR(r->first_loss, std::log(64.0), 0.3);  // about uniform at the start
  // 4.16 -> about 2.65 here (the character statistics are learned first); 0.7 leaves a margin.
  EXPECT_LT(r->final_loss, 0.7 * r->first_loss);
}

TEST(TrainerTest, InitFromSavedWeightsContinuesExactly) {
  zinf::testing::TempDir tmp;
  Config c = SmallModel();
  auto a = Train(Options(c, tmp.path(), "a", 2));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  TrainOptions o = Options(c, tmp.path(), "b", 1);
  o.init_path = tmp / "a.safetensors";
  o.steps = 1;
  auto b = Train(o);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  // Starting from the saved weights, the first loss is that of the saved model: below the start.
  EXPECT_LT(b->first_loss, a->first_loss);
  // Another model's weights are refused naming the size that differs (the file records its
  // model; a file recording none gets the tensor named: train_cli_test.cc).
  Config other = c;
  other.zinf.model.width = 64;
  o.config = other;
  auto bad = Train(o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("metadata n_embd 32 disagrees with the model's "
                                        "zinf.model.width 64"),
            std::string::npos)
      << bad.status().ToString();
}

// The head count does not show in the tensors' shapes: weights saved with 4 heads loaded into a
// 2-head model would train a different model silently. Refused, naming both counts.
TEST(TrainerTest, InitRefusesWeightsRecordingAnotherModel) {
  zinf::testing::TempDir tmp;
  Config c = SmallModel();
  ASSERT_TRUE(Train(Options(c, tmp.path(), "a", 1)).ok());
  TrainOptions o = Options(c, tmp.path(), "b", 1);
  o.init_path = tmp / "a.safetensors";
  o.config.zinf.model.heads = 2;
  auto bad = Train(o);
  ASSERT_FALSE(bad.ok());
  const std::string m = bad.status().message();
  for (const char* s : {"a.safetensors", "n_head 4", "zinf.model.heads 2"}) {
    EXPECT_NE(m.find(s), std::string::npos) << s << " not in: " << m;
  }
}

TEST(TrainerTest, Fp16WithDynamicLossScalingTrains) {
  zinf::testing::TempDir tmp;
  Config c = SmallModel();
  c.fp16.enabled = true;
  c.fp16.initial_scale_power = 24;  // overflows at first: the scaler must back off
  c.fp16.hysteresis = 1;
  auto r = Train(Options(c, tmp.path(), "fp16", 20));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_GT(r->skipped_steps, 0u);
  EXPECT_LT(r->skipped_steps, 15u);
  EXPECT_LT(r->final_loss, r->first_loss);
}

// With the state on NVMe the optimizer pipeline starts during the last backward, its first
// units' state read before the step knows whether it is skipped. A skipped step (an fp16
// overflow) undoes it: nothing is written, and training stays bit for bit the resident run.
TEST(TrainerTest, SkippedStepsUndoTheOptimizerStepStartedDuringBackward) {
  zinf::testing::TempDir tmp;
  Config res = SmallModel(), off = Offloaded(tmp.path());
  for (Config* c : {&res, &off}) {
    c->bf16.enabled = false;
    c->fp16.enabled = true;
    c->fp16.initial_scale_power = 24;  // overflows at first: the scaler must back off
    c->fp16.hysteresis = 1;
  }
  auto resident = Train(Options(res, tmp.path(), "resident", 8));
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  auto offloaded = Train(Options(off, tmp.path(), "offloaded", 8));
  ASSERT_TRUE(offloaded.ok()) << offloaded.status().ToString();
  EXPECT_GT(offloaded->skipped_steps, 0u);
  EXPECT_EQ(offloaded->skipped_steps, resident->skipped_steps);
  EXPECT_GT(offloaded->nvme_read_bytes, 0u);
  EXPECT_EQ(ReadLosses(tmp / "resident.losses"), ReadLosses(tmp / "offloaded.losses"));
  EXPECT_TRUE(ReadTensors(tmp / "resident.safetensors") ==
              ReadTensors(tmp / "offloaded.safetensors"));
}

// The Llama family through the same executor: offload changes nothing bit for bit (tied and
// untied heads, with and without accumulation), and the loss falls.
Config Llama(Config c, bool tied) {
  c.zinf.model.arch = "llama";
  c.zinf.model.kv_heads = 2;
  c.zinf.model.intermediate = 48;
  c.zinf.model.tie_embeddings = tied;
  return c;
}

class LlamaOffloadTest : public ::testing::TestWithParam<std::pair<bool, uint64_t>> {};

TEST_P(LlamaOffloadTest, OffloadChangesNothingBitForBit) {
  zinf::testing::TempDir tmp;
  const auto [tied, gas] = GetParam();
  Config res = Llama(SmallModel(), tied), off = Llama(Offloaded(tmp.path()), tied);
  res.train.gradient_accumulation_steps = off.train.gradient_accumulation_steps = gas;
  TrainOptions ro = Options(res, tmp.path(), "resident", 4);
  TrainOptions oo = Options(off, tmp.path(), "off", 4);
  ro.save_path = oo.save_path = "";  // --save is GPT-2's (nanoGPT names) so far
  auto resident = Train(ro);
  ASSERT_TRUE(resident.ok()) << resident.status().ToString();
  auto offloaded = Train(oo);
  ASSERT_TRUE(offloaded.ok()) << offloaded.status().ToString();
  EXPECT_EQ(resident->nvme_read_bytes, 0u);
  EXPECT_GT(offloaded->nvme_read_bytes, 0u);
  EXPECT_LE(offloaded->peak_device_bytes, offloaded->device_budget_bytes);
  const auto l1 = ReadLosses(tmp / "resident.losses"), l2 = ReadLosses(tmp / "off.losses");
  ASSERT_EQ(l1.size(), 4u);
  EXPECT_NEAR(l1[0], std::log(64.0), 0.3);  // about uniform at the start
  EXPECT_EQ(l1, l2);
}

INSTANTIATE_TEST_SUITE_P(Heads, LlamaOffloadTest,
                         ::testing::Values(std::pair{true, 1}, std::pair{false, 2}),
                         [](const auto& info) {
                           return fmt::format("{}Gas{}", info.param.first ? "Tied" : "Untied",
                                              info.param.second);
                         });

TEST(TrainerTest, LlamaLossFallsAndRefusesWhatItCannotWrite) {
  zinf::testing::TempDir tmp;
  Config c = Llama(SmallModel(), false);
  c.train.gradient_accumulation_steps = 1;
  c.train.train_micro_batch_size_per_gpu = 8;
  TrainOptions o = Options(c, tmp.path(), "run", 60);
  o.save_path = "";
  auto r = Train(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_LT(r->final_loss, 0.7 * r->first_loss);
  // --save writes nanoGPT's GPT-2 names: refused at start for a Llama model, not at the end.
  o = Options(c, tmp.path(), "saved", 1);
  auto refused = Train(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--save"), std::string::npos)
      << refused.status().ToString();
  EXPECT_EQ(refused.status().code(), StatusCode::kUnimplemented);
}

TEST(TrainerTest, RefusesWhatCannotRun) {
  zinf::testing::TempDir tmp;
  Config c = Offloaded(tmp.path());
  c.zinf.budgets.device_bytes = 64 << 10;  // below the activations
  auto r = Train(Options(c, tmp.path(), "x", 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("device_bytes"), std::string::npos) << r.status().ToString();
  // Room for the pipeline's slab and the gradient staging, not for the two gradient shards the
  // optimizer holds at once: refused at start with the size it needs.
  c = Offloaded(tmp.path());
  c.zinf.budgets.pinned_bytes = 448 << 10;
  c.aio.block_size = 64 << 10;
  r = Train(Options(c, tmp.path(), "z", 1));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pinned_bytes"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("two gradient leases"), std::string::npos)
      << r.status().ToString();
  TrainOptions o = Options(SmallModel(), tmp.path(), "y", 1);
  o.data_path = tmp / "missing.txt";
  r = Train(o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("missing.txt"), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace zinf::train
