// Config read onto a base config (ConfigParseOptions::base, as `zinf train` reads its file
// onto the default job's): what the document gives replaces the base's value, the rest stays;
// the batch keys and the scheduler block are replaced whole; given_keys names what was given.
#include "src/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace zinf {
namespace {

using ::testing::HasSubstr;

constexpr char kSource[] = "test.json";

Result<Config> Load(std::string_view text) {
  ConfigParseOptions options;
  options.source_name = kSource;
  return Config::FromString(text, options);
}

// A base unlike the struct defaults in every field the tests below look at.
Config Base() {
  Config b;
  b.zinf.model = {.layers = 6, .width = 192, .heads = 6, .seq_len = 128, .vocab = 256};
  b.train.train_micro_batch_size_per_gpu = 8;
  b.optimizer.lr = 2e-3;
  b.scheduler.type = SchedulerType::kWarmupCosineLR;
  b.scheduler.warmup_num_steps = 10;
  b.scheduler.warmup_type = WarmupType::kLinear;
  b.scheduler.cos_min_ratio = 0.1;
  b.train.gradient_clipping = 1.0;
  b.zero.offload_param.device = OffloadDevice::kNvme;
  b.zero.offload_optimizer.device = OffloadDevice::kNvme;
  b.unimplemented = {"x=1"};
  return b;
}

Result<Config> LoadOnto(std::string_view text, const Config& base) {
  ConfigParseOptions options;
  options.source_name = kSource;
  options.base = &base;
  options.validate = false;  // the base's nvme devices have no nvme_path yet
  return Config::FromString(text, options);
}

TEST(ConfigBaseTest, ADocumentReadOntoABaseSetsOnlyWhatItNames) {
  const Config base = Base();
  auto r = LoadOnto(R"({"zero_optimization": {"offload_optimizer": {"device": "cpu"}},
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}})",
                    base);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->zero.offload_optimizer.device, OffloadDevice::kCpu);  // DeepSpeed's meaning
  EXPECT_EQ(r->zero.offload_param.device, OffloadDevice::kNvme);     // the base's
  EXPECT_DOUBLE_EQ(r->optimizer.lr, 1e-4);
  EXPECT_EQ(r->zinf.model.layers, 6u);
  EXPECT_EQ(r->zinf.model.width, 192u);
  EXPECT_EQ(r->MicroBatchSize(), 8u);
  EXPECT_DOUBLE_EQ(r->train.gradient_clipping, 1.0);
  EXPECT_EQ(r->scheduler.type, SchedulerType::kWarmupCosineLR);
  EXPECT_EQ(r->scheduler.warmup_num_steps, 10u);
  EXPECT_EQ(r->zero.stage, 3);
  EXPECT_TRUE(r->unimplemented.empty()) << "the base's list was carried over";
  EXPECT_EQ(r->given_keys, (std::vector<std::string>{"zero_optimization.offload_optimizer.device",
                                                     "optimizer.type", "optimizer.params.lr"}));
  // "{}" is the base itself.
  auto empty = LoadOnto("{}", base);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->ToJson(), base.ToJson());
  EXPECT_TRUE(empty->given_keys.empty());
  // validate (the default) checks the merged config: the base's nvme device lacks a path.
  ConfigParseOptions checked;
  checked.base = &base;
  auto refused = Config::FromString("{}", checked);
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(refused.status().message(), HasSubstr("offload_param.nvme_path: missing"));
}

TEST(ConfigBaseTest, BatchKeysAndTheSchedulerAreReplacedWhole) {
  const Config base = Base();
  // DeepSpeed's meaning of a lone train_batch_size: micro 16, not the base's 8 twice.
  auto batch = LoadOnto(R"({"train_batch_size": 16})", base);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(batch->MicroBatchSize(), 16u);
  EXPECT_EQ(batch->GradientAccumulationSteps(), 1u);
  auto gas = LoadOnto(R"({"gradient_accumulation_steps": 4})", base);
  ASSERT_TRUE(gas.ok());
  EXPECT_EQ(gas->MicroBatchSize(), 1u);
  EXPECT_EQ(gas->TrainBatchSize(), 4u);
  for (const char* k : {"train_batch_size", "train_micro_batch_size_per_gpu",
                        "gradient_accumulation_steps"}) {
    EXPECT_NE(std::find(gas->given_keys.begin(), gas->given_keys.end(), k), gas->given_keys.end())
        << k;
  }
  // "auto" gives nothing: the base's batch stays.
  auto automatic = LoadOnto(R"({"train_micro_batch_size_per_gpu": "auto"})", base);
  ASSERT_TRUE(automatic.ok());
  EXPECT_EQ(automatic->MicroBatchSize(), 8u);
  EXPECT_TRUE(automatic->given_keys.empty());

  // A scheduler block is a whole schedule: its parameters start from their defaults, not from
  // the base's cosine.
  auto warmup = LoadOnto(R"({"scheduler": {"type": "WarmupLR"}})", base);
  ASSERT_TRUE(warmup.ok()) << warmup.status().ToString();
  EXPECT_EQ(warmup->scheduler.type, SchedulerType::kWarmupLR);
  EXPECT_EQ(warmup->scheduler.warmup_num_steps, 1000u);
  EXPECT_EQ(warmup->scheduler.warmup_type, WarmupType::kLog);
  EXPECT_EQ(warmup->given_keys,
            (std::vector<std::string>{"scheduler", "scheduler.type"}));
  // null: no scheduler, a constant learning rate.
  auto none = LoadOnto(R"({"scheduler": null})", base);
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_EQ(none->scheduler.type, SchedulerType::kNone);
  EXPECT_TRUE(none->ToJson()["scheduler"].is_null());
  auto plain = Load(R"({"scheduler": null})");
  ASSERT_TRUE(plain.ok());
  EXPECT_EQ(plain->scheduler.type, SchedulerType::kNone);
  // ToJson's null reads back as no scheduler on a base that has one.
  auto again = LoadOnto(none->ToJson().dump(), base);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ToJson(), none->ToJson());
}

TEST(ConfigBaseTest, GivenKeysAreNamedAsToJsonWritesThem) {
  auto r = Load(R"({"zinf": {"model": {"n_layer": 2, "n_embd": 64}},
                    "bfloat16": {"enabled": true}, "aio": {"io_backend": "posix"},
                    "optimizer": {"type": "adam", "params": {"betas": [0.9, 0.95], "lr": "auto"}},
                    "zero_optimization": {"stage": 3, "overlap_comm": true}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<std::string> given = r->given_keys;
  std::sort(given.begin(), given.end());
  EXPECT_EQ(given, (std::vector<std::string>{"aio.engine", "bf16.enabled", "fp16.enabled",
                                             "optimizer.params.betas", "optimizer.type",
                                             "zero_optimization.stage",
                                             "zinf.model.layers", "zinf.model.width"}));
  // Every given path is one ToJson writes.
  const nlohmann::ordered_json j = r->ToJson();
  for (std::string p : given) {
    std::replace(p.begin(), p.end(), '.', '/');
    EXPECT_TRUE(j.contains(nlohmann::ordered_json::json_pointer("/" + p))) << p;
  }
}

}  // namespace
}  // namespace zinf

namespace zinf {
namespace {

// "auto" for a budget on a base config means zinf's automatic choice, not the base's number
// (it was ignored, so a file asking for an automatic pinned budget kept the default job's 24M).
TEST(ConfigBaseTest, AutoBudgetsResetTheBasesNumbers) {
  Config base = Base();
  base.zinf.budgets.device_bytes = 44ull << 20;
  base.zinf.budgets.pinned_bytes = 24ull << 20;
  auto r = LoadOnto(R"({"zinf": {"budgets": {"pinned_bytes": "auto"}}})", base);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->zinf.budgets.pinned_bytes.has_value());
  EXPECT_EQ(r->zinf.budgets.device_bytes, 44ull << 20);  // not named: the base's
}

}  // namespace
}  // namespace zinf
