#include "src/config/config.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "src/base/log.h"
#include "tests/test_util.h"

namespace zinf {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kSource[] = "test.json";

Result<Config> Load(std::string_view text, bool strict = false) {
  ConfigParseOptions options;
  options.source_name = kSource;
  options.strict = strict;
  return Config::FromString(text, options);
}

// The message of a refused load (fails the test when the load succeeded).
std::string Refusal(std::string_view text, bool strict = false) {
  auto r = Load(text, strict);
  EXPECT_FALSE(r.ok()) << "accepted: " << text;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  return r.status().message();
}

size_t Lines(const std::string& s) { return std::count(s.begin(), s.end(), '\n') + 1; }

// Captures what the project logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) {
    Log().sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = Log().sinks();
    sinks.erase(std::remove(sinks.begin(), sinks.end(), sink_), sinks.end());
  }
  std::string text() const { return out_.str(); }
  size_t Count(std::string_view needle) const {
    const std::string s = out_.str();
    size_t n = 0;
    for (size_t at = s.find(needle); at != std::string::npos; at = s.find(needle, at + 1)) ++n;
    return n;
  }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

std::string ExamplePath(const std::string& name) {
  return std::string(ZINF_SOURCE_DIR) + "/examples/" + name;
}

// --- defaults and accepted input ----------------------------------------------------------

TEST(ConfigTest, DefaultsWhenKeysAbsent) {
  auto r = Load("{}");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Config& c = *r;
  EXPECT_EQ(c.source, kSource);
  EXPECT_EQ(c.zero.stage, 3);
  EXPECT_EQ(c.zero.offload_param.device, OffloadDevice::kNone);
  EXPECT_EQ(c.zero.offload_param.buffer_count, 5u);
  EXPECT_EQ(c.zero.offload_param.buffer_size, 100'000'000u);
  EXPECT_EQ(c.zero.offload_param.max_in_cpu, 1'000'000'000u);
  EXPECT_FALSE(c.zero.offload_param.pin_memory);
  EXPECT_EQ(c.zero.offload_optimizer.buffer_count, 4u);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_read);
  EXPECT_TRUE(c.zero.offload_optimizer.pipeline_write);
  EXPECT_EQ(c.zero.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_EQ(c.zero.stage3_max_live_parameters, 1'000'000'000u);
  EXPECT_EQ(c.zero.sub_group_size, 1'000'000'000u);
  EXPECT_EQ(c.aio.block_size, 1u << 20);
  EXPECT_EQ(c.aio.queue_depth, 8u);
  EXPECT_EQ(c.aio.intra_op_parallelism, 1u);
  EXPECT_EQ(c.aio.engine, "auto");
  EXPECT_EQ(c.optimizer.type, OptimizerType::kAdamW);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_EQ(c.scheduler.type, SchedulerType::kNone);
  EXPECT_EQ(c.precision(), Precision::kBf16);
  EXPECT_EQ(c.fp16.initial_scale_power, 16u);
  EXPECT_EQ(c.fp16.loss_scale_window, 1000u);
  EXPECT_EQ(c.fp16.hysteresis, 2u);
  EXPECT_EQ(c.MicroBatchSize(), 1u);
  EXPECT_EQ(c.GradientAccumulationSteps(), 1u);
  EXPECT_EQ(c.TrainBatchSize(), 1u);
  EXPECT_DOUBLE_EQ(c.train.gradient_clipping, 0.0);
  EXPECT_FALSE(c.zinf.budgets.device_bytes.has_value());
  EXPECT_EQ(c.zinf.prefetch_depth, 4u);
  EXPECT_EQ(c.zinf.pipeline_depth, 2u);
  EXPECT_EQ(c.zinf.model.vocab, 256u);
  EXPECT_FALSE(c.zinf.strict);
  EXPECT_TRUE(c.unimplemented.empty());
  EXPECT_TRUE(c.Validate().ok());
  // Defaults() is the same as loading "{}".
  EXPECT_EQ(Config::Defaults().ToJson(), c.ToJson());
}

TEST(ConfigTest, ExampleConfigsLoad) {
  auto ours = Config::FromFile(ExamplePath("offload_nvme.json"));
  ASSERT_TRUE(ours.ok()) << ours.status().ToString();
  EXPECT_TRUE(ours->unimplemented.empty());
  EXPECT_EQ(ours->zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(ours->zero.offload_optimizer.device, OffloadDevice::kNvme);
  EXPECT_TRUE(ours->zinf.budgets.pinned_bytes.has_value());

  LogCapture log;
  auto ds = Config::FromFile(ExamplePath("deepspeed_zero3_nvme.json"));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_FALSE(ds->unimplemented.empty());
  EXPECT_EQ(log.Count("not implemented"), 1u) << log.text();
  EXPECT_EQ(ds->zero.offload_param.device, OffloadDevice::kNvme);
  EXPECT_EQ(ds->zero.offload_param.buffer_size, 100'000'000u);  // written 1e8
  EXPECT_EQ(ds->zero.sub_group_size, 1'000'000'000u);           // written 1e9
  EXPECT_EQ(ds->precision(), Precision::kBf16);

  ConfigParseOptions strict;
  strict.strict = true;
  EXPECT_FALSE(Config::FromFile(ExamplePath("deepspeed_zero3_nvme.json"), strict).ok());
}

// zinf.model.arch "llama" with HF's key names as aliases; its keys are refused with gpt2, and
// the round trip through ToJson keeps them.
TEST(ConfigTest, LlamaModelKeys) {
  auto r = Load(R"({"zinf": {"model": {"arch": "llama", "layers": 2, "hidden": 64,
      "num_key_value_heads": 2, "intermediate_size": 160, "rms_norm_eps": 1e-5,
      "rope_theta": 500000, "tie_word_embeddings": true}}})");
  ASSERT_FALSE(r.ok());  // "hidden" is not a key (width is)
  EXPECT_THAT(r.status().message(), HasSubstr("zinf.model.hidden"));
  r = Load(R"({"zinf": {"model": {"arch": "llama", "layers": 2, "width": 64,
      "num_key_value_heads": 2, "intermediate_size": 160, "rms_norm_eps": 1e-5,
      "rope_theta": 500000, "tie_word_embeddings": true}}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelConfig& m = r->zinf.model;
  EXPECT_TRUE(m.is_llama());
  EXPECT_EQ(m.KvHeads(), 2u);
  EXPECT_EQ(m.Intermediate(), 160u);
  EXPECT_EQ(m.norm_eps, 1e-5);
  EXPECT_EQ(m.rope_theta, 500000.0);
  EXPECT_TRUE(m.tie_embeddings);
  // layer: q 64·64 + k, v 2·16·64 each + o 64·64 + 3·64·160 + 2·64; tied: final is the norm.
  EXPECT_EQ(m.BlockParams(), 64u * 64 + 2 * 32 * 64 + 64 * 64 + 3 * 64 * 160 + 2 * 64);
  EXPECT_EQ(m.EmbeddingParams(), 256u * 64);
  EXPECT_EQ(m.FinalParams(), 64u);
  auto again = Load(r->ToJson().dump());
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->ToJson(), r->ToJson());
  // Meta's MLP width by default: 8/3 of the width rounded up to 256.
  auto d = Load(R"({"zinf": {"model": {"arch": "llama", "width": 4096, "heads": 32}}})");
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ(d->zinf.model.Intermediate(), 11008u);  // Llama 2 7B's
  EXPECT_FALSE(d->zinf.model.tie_embeddings);       // HF's default
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"num_key_value_heads": 2}}})"),
              AllOf(HasSubstr("zinf.model.num_key_value_heads"), HasSubstr("gpt2")));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"tie_embeddings": false}}})"),
              HasSubstr("zinf.model.tie_embeddings"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "llama", "heads": 4, "kv_heads": 3}}})"),
              HasSubstr("zinf.model.kv_heads: 3 does not divide"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "llama", "width": 12, "heads": 4}}})"),
              HasSubstr("odd head_dim 3"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "mamba"}}})"), HasSubstr("zinf.model.arch"));
  // The rest of HF's Llama-family shape: head_dim, the biases, rope_scaling, the window.
  auto q = Load(R"({"zinf": {"model": {"arch": "llama", "width": 64, "heads": 4,
      "head_dim": 8, "qkv_bias": true, "sliding_window": 64, "seq_len": 64,
      "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}}})");
  ASSERT_TRUE(q.ok()) << q.status().ToString();
  EXPECT_EQ(q->zinf.model.HeadDim(), 8u);
  EXPECT_EQ(q->zinf.model.rope_scaling.type, "llama3");
  EXPECT_EQ(q->zinf.model.rope_scaling.factor, 8.0);
  EXPECT_TRUE(q->zinf.model.qkv_bias);
  auto q2 = Load(q->ToJson().dump());
  ASSERT_TRUE(q2.ok()) << q2.status().ToString();
  EXPECT_EQ(q2->zinf.model.rope_scaling, q->zinf.model.rope_scaling);
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "llama",
      "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}}})"),
              HasSubstr("zinf.model.rope_scaling.rope_type"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"rope_scaling": {"rope_type": "llama3"}}}})"),
              HasSubstr("zinf.model.rope_scaling: is a key of arch"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "llama", "sliding_window": 16}}})"),
              HasSubstr("longer than zinf.model.sliding_window 16"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"arch": "llama", "head_dim": 7}}})"),
              HasSubstr("zinf.model.head_dim: 7 is odd"));
}

TEST(ConfigTest, ByteStringsParse) {
  auto r = Load(R"({
    "aio": {"block_size": "256K"},
    "zinf": {"budgets": {"device_bytes": "4G", "pinned_bytes": "512MiB", "host_bytes": 8589934592},
             "stripe_bytes": "2M"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->aio.block_size, 256u << 10);
  EXPECT_EQ(*r->zinf.budgets.device_bytes, 4ull << 30);
  EXPECT_EQ(*r->zinf.budgets.pinned_bytes, 512ull << 20);
  EXPECT_EQ(*r->zinf.budgets.host_bytes, 8ull << 30);
  EXPECT_EQ(r->zinf.stripe_bytes, 2u << 20);

  std::string m = Refusal(R"({"zinf": {"budgets": {"pinned_bytes": "4Q"}}})");
  EXPECT_THAT(m, HasSubstr("zinf.budgets.pinned_bytes: \"4Q\" is not a byte size"));
}

TEST(ConfigTest, RoundTripThroughToJson) {
  auto r = Load(R"({
    "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
    "gradient_clipping": 1.0, "steps_per_print": 10,
    "zero_optimization": {"stage": 3,
      "offload_param": {"device": "nvme", "nvme_path": "/mnt/nvme", "pin_memory": true},
      "offload_optimizer": {"device": "cpu", "pipeline_write": false},
      "stage3_prefetch_bucket_size": 1e7},
    "aio": {"block_size": 262144, "queue_depth": 32, "engine": "posix"},
    "optimizer": {"type": "adam", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-6,
                                             "weight_decay": 0.1, "adam_w_mode": false}},
    "scheduler": {"type": "WarmupCosineLR",
                  "params": {"total_num_steps": 1000, "warmup_num_steps": 100,
                             "warmup_type": "linear", "cos_min_ratio": 0.1}},
    "fp16": {"enabled": true, "initial_scale_power": 12},
    "zinf": {"budgets": {"device_bytes": "1G"}, "stripe_paths": ["/a", "/b"], "seed": 7,
             "model": {"layers": 2, "width": 64, "heads": 2}, "trace_file": "t.json"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->optimizer.type, OptimizerType::kAdam);
  EXPECT_FALSE(r->optimizer.DecoupledWeightDecay());
  EXPECT_EQ(r->TrainBatchSize(), 32u);
  EXPECT_EQ(r->precision(), Precision::kFp16);

  const std::string printed = r->ToJson().dump(2);
  auto again = Load(printed);
  ASSERT_TRUE(again.ok()) << again.status().ToString() << "\n" << printed;
  EXPECT_EQ(again->ToJson(), r->ToJson());
  // A prefetch bucket other than DeepSpeed's default has no effect in zinf: named, both times.
  EXPECT_EQ(r->unimplemented,
            std::vector<std::string>{"zero_optimization.stage3_prefetch_bucket_size=10000000.0"});
  EXPECT_EQ(again->unimplemented,
            std::vector<std::string>{"zero_optimization.stage3_prefetch_bucket_size=10000000"});
  EXPECT_EQ(again->zinf.stripe_paths, (std::vector<std::string>{"/a", "/b"}));
  EXPECT_DOUBLE_EQ(again->scheduler.cos_min_ratio, 0.1);
  EXPECT_EQ(again->aio.engine, "posix");
  EXPECT_FALSE(again->zero.offload_optimizer.pipeline_write);

  // fp32 (both 16-bit formats off) survives the trip too.
  auto fp32 = Load(R"({"bf16": {"enabled": false}})");
  ASSERT_TRUE(fp32.ok());
  EXPECT_EQ(fp32->precision(), Precision::kFp32);
  EXPECT_EQ(Load(fp32->ToJson().dump())->precision(), Precision::kFp32);
}

TEST(ConfigTest, AutoMeansTheDefault) {
  auto r = Load(R"({"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                    "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},
                    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto",
                                  "eps": "auto", "weight_decay": "auto"}},
                    "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto",
                                          "stage3_prefetch_bucket_size": "auto"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_DOUBLE_EQ(r->optimizer.lr, 1e-3);
  EXPECT_EQ(r->precision(), Precision::kBf16);
  EXPECT_EQ(r->zero.stage3_prefetch_bucket_size, 50'000'000u);
  EXPECT_TRUE(r->unimplemented.empty());  // "auto" asks for nothing
  EXPECT_NE(std::find(r->auto_keys.begin(), r->auto_keys.end(), "optimizer.params.lr"),
            r->auto_keys.end());
}

TEST(ConfigTest, BatchKeysResolveLikeDeepSpeed) {
  auto a = Load(R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->GradientAccumulationSteps(), 8u);
  auto b = Load(R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->MicroBatchSize(), 8u);
  auto c = Load(R"({"train_batch_size": 16})");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->MicroBatchSize(), 16u);
  EXPECT_EQ(c->GradientAccumulationSteps(), 1u);
}

TEST(ConfigTest, TunedAioBlockLoads) {
  // What `zinf tune` prints for the config.
  auto r = Load(R"({"aio": {"block_size": 1048576, "queue_depth": 32,
                            "intra_op_parallelism": 32, "single_submit": false,
                            "overlap_events": true, "engine": "posix"}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->aio.intra_op_parallelism, 32u);
  EXPECT_EQ(r->aio.engine, "posix");
  EXPECT_TRUE(r->unimplemented.empty());
  // DeepSpeed's spelling of the same.
  auto ds = Load(R"({"aio": {"thread_count": 4, "io_backend": "async_io"}})");
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->aio.intra_op_parallelism, 4u);
  EXPECT_EQ(ds->aio.engine, "aio");
}

TEST(ConfigTest, AdamDecaysLikeAdamWUnlessAdamWModeIsFalse) {
  EXPECT_TRUE(Load(R"({"optimizer": {"type": "Adam"}})")->optimizer.DecoupledWeightDecay());
  EXPECT_FALSE(Load(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
                   ->optimizer.DecoupledWeightDecay());
  EXPECT_TRUE(Load(R"({"optimizer": {"type": "AdamW", "params": {"adam_w_mode": false}}})")
                  ->optimizer.DecoupledWeightDecay());
}

// --- refusals -----------------------------------------------------------------------------

TEST(ConfigTest, UnknownKeyIsRefusedWithSuggestion) {
  std::string m = Refusal(R"({"optimiser": {"type": "AdamW"}})");
  EXPECT_THAT(m, HasSubstr("test.json: optimiser: unknown key"));
  EXPECT_THAT(m, HasSubstr("did you mean \"optimizer\"?"));
}

TEST(ConfigTest, TypoAtNestedLevelIsRefusedWithItsPath) {
  std::string m = Refusal(R"({"zero_optimization": {"offload_parm": {"device": "cpu"}}})");
  EXPECT_THAT(m, HasSubstr("test.json: zero_optimization.offload_parm: unknown key"));
  EXPECT_THAT(m, HasSubstr("did you mean \"offload_param\"?"));

  m = Refusal(R"({"zero_optimization": {"offload_param": {"device": "cpu", "bufer_count": 4}}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_param.bufer_count: unknown key"));
  EXPECT_THAT(m, HasSubstr("did you mean \"buffer_count\"?"));

  m = Refusal(R"({"zinf": {"budgets": {"pined_bytes": "1G"}}})");
  EXPECT_THAT(m, HasSubstr("zinf.budgets.pined_bytes: unknown key"));
  EXPECT_THAT(m, HasSubstr("did you mean \"pinned_bytes\"?"));
}

TEST(ConfigTest, KeyAtTheWrongLevelSaysWhereItBelongs) {
  std::string m = Refusal(R"({"zero_optimization": {"nvme_path": "/mnt/nvme"}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.nvme_path: unknown key"));
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_param.nvme_path"));
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_optimizer.nvme_path"));
}

TEST(ConfigTest, UnimplementedDeepSpeedKeysAreWarnedOnceTogether) {
  constexpr char kText[] = R"({
    "zero_optimization": {"stage": 3, "overlap_comm": true, "reduce_bucket_size": 5e8,
                          "contiguous_gradients": true, "stage3_max_reuse_distance": 1e9},
    "aio": {"use_gds": true},
    "fp16": {"enabled": false, "auto_cast": true},
    "tensorboard": {"enabled": true, "output_path": "runs"}})";
  LogCapture log;
  auto r = Load(kText);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->unimplemented.size(), 7u);
  EXPECT_EQ(log.Count("not implemented"), 1u) << log.text();
  for (const char* key :
       {"zero_optimization.overlap_comm=true", "zero_optimization.reduce_bucket_size=500000000.0",
        "zero_optimization.contiguous_gradients=true",
        "zero_optimization.stage3_max_reuse_distance=", "aio.use_gds=true", "fp16.auto_cast=true",
        "tensorboard="}) {
    EXPECT_THAT(log.text(), HasSubstr(key));
  }
}

// DeepSpeed's staging-buffer and bucket sizes are checked like any value, and named in the one
// warning when they ask for something zinf does not do (zinf stages through its pinned budget).
TEST(ConfigTest, DeepSpeedBufferSizesAreCheckedAndWarnedUnlessTheirDefaults) {
  LogCapture log;
  auto quiet = Load(R"({"zero_optimization": {
      "offload_param": {"device": "nvme", "nvme_path": "/n", "pin_memory": true, "buffer_count": 5,
                        "buffer_size": 1e8, "max_in_cpu": 1e9},
      "offload_optimizer": {"device": "nvme", "nvme_path": "/n", "pin_memory": true,
                            "buffer_count": 4, "pipeline_read": false},
      "stage3_prefetch_bucket_size": 5e7, "stage3_max_live_parameters": 1e9,
      "sub_group_size": 1e9}})");
  ASSERT_TRUE(quiet.ok()) << quiet.status().ToString();
  EXPECT_TRUE(quiet->unimplemented.empty());
  EXPECT_EQ(log.Count("not implemented"), 0u) << log.text();
  auto loud = Load(R"({"zero_optimization": {
      "offload_param": {"buffer_count": 8, "buffer_size": 2e8},
      "offload_optimizer": {"buffer_count": 6},
      "stage3_max_live_parameters": 3e8, "sub_group_size": 1e8}})");
  ASSERT_TRUE(loud.ok()) << loud.status().ToString();
  EXPECT_EQ(loud->unimplemented.size(), 5u);
  EXPECT_EQ(log.Count("not implemented"), 1u) << log.text();
  for (const char* key : {"offload_param.buffer_count=8", "offload_param.buffer_size=",
                          "offload_optimizer.buffer_count=6", "stage3_max_live_parameters=",
                          "sub_group_size="}) {
    EXPECT_THAT(log.text(), HasSubstr(key));
  }
  std::string m = Refusal(R"({"zero_optimization": {"sub_group_size": 1e8}})", /*strict=*/true);
  EXPECT_THAT(m, HasSubstr("zero_optimization.sub_group_size=100000000.0: a DeepSpeed key"));
}

TEST(ConfigTest, UnimplementedDeepSpeedKeysAreRefusedWhenStrict) {
  constexpr char kText[] = R"({"zero_optimization": {"overlap_comm": true},
                               "aio": {"use_gds": true}})";
  std::string m = Refusal(kText, /*strict=*/true);
  EXPECT_THAT(m, HasSubstr("test.json: zero_optimization.overlap_comm=true: a DeepSpeed key"));
  EXPECT_THAT(m, HasSubstr("aio.use_gds=true"));
  EXPECT_THAT(m, HasSubstr("strict"));
  // The same from the config itself.
  m = Refusal(R"({"zero_optimization": {"overlap_comm": true}, "zinf": {"strict": true}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.overlap_comm=true"));
}

TEST(ConfigTest, UnimplementedKeysThatAskForNothingAreSilent) {
  LogCapture log;
  auto r = Load(R"({"aio": {"use_gds": false, "single_submit": false, "overlap_events": true},
                    "fp16": {"auto_cast": false}, "tensorboard": {"enabled": false},
                    "zero_optimization": {"overlap_comm": false,
                      "offload_optimizer": {"device": "cpu", "ratio": 1.0}},
                    "communication_data_type": null,
                    "activation_checkpointing": {"partition_activations": false,
                                                 "cpu_checkpointing": false}})",
                /*strict=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->unimplemented.empty());
  EXPECT_EQ(log.Count("not implemented"), 0u);
}

TEST(ConfigTest, FsdpShardingStrategiesArePresetsOverTheStage) {
  struct Case {
    const char* strategy;
    int stage;
  } cases[] = {{"NO_SHARD", 0}, {"SHARD_GRAD_OP", 2}, {"FULL_SHARD", 3}, {"HYBRID_SHARD", 3}};
  for (const Case& c : cases) {
    auto r = Load(fmt::format(R"({{"zinf": {{"sharding_strategy": "{}"}}}})", c.strategy));
    ASSERT_TRUE(r.ok()) << c.strategy << r.status().ToString();
    EXPECT_EQ(r->Stage(), c.stage) << c.strategy;
  }
  auto agree = Load(R"({"zero_optimization": {"stage": 0}, "zinf": {"sharding_strategy": "NO_SHARD"}})");
  ASSERT_TRUE(agree.ok()) << agree.status().ToString();
  EXPECT_THAT(Refusal(R"({"zero_optimization": {"stage": 1},
                          "zinf": {"sharding_strategy": "NO_SHARD"}})"),
              HasSubstr("zinf.sharding_strategy NO_SHARD means zero_optimization.stage 0, but "
                        "the stage given is 1; give one of them, or both agreeing"));
  EXPECT_THAT(Refusal(R"({"zinf": {"sharding_strategy": "SHARD_EVERYTHING"}})"),
              HasSubstr("zinf.sharding_strategy: \"SHARD_EVERYTHING\"; expected NO_SHARD, "
                        "SHARD_GRAD_OP, FULL_SHARD or HYBRID_SHARD"));
  EXPECT_EQ(Config::Defaults().Stage(), 3);
}

TEST(ConfigTest, CommBackendIsGlooOrNccl) {
  EXPECT_EQ(Config::Defaults().zinf.comm.backend, "gloo");
  auto nccl = Load(R"({"zinf": {"comm": {"backend": "nccl"}}})");
  ASSERT_TRUE(nccl.ok()) << nccl.status().ToString();
  EXPECT_EQ(nccl->zinf.comm.backend, "nccl");
  EXPECT_EQ(nccl->ToJson()["zinf"]["comm"]["backend"], "nccl");
  EXPECT_THAT(Refusal(R"({"zinf": {"comm": {"backend": "mpi"}}})"),
              HasSubstr("zinf.comm.backend: \"mpi\" is not allowed; expected one of \"gloo\", "
                        "\"nccl\""));
}

TEST(ConfigTest, EveryZeroStageIsAcceptedAndOthersRefused) {
  // Stages 0, 1 and 2 run across ranks, 3 is what one rank does (src/train/ranks.h).
  for (const char* doc : {R"({"zero_optimization": {"stage": 0}})",
                          R"({"zero_optimization": {"stage": 1}})",
                          R"({"zero_optimization": {"stage": 2}})",
                          R"({"zero_optimization": {"stage": 3}})"}) {
    auto ok = Load(doc, /*strict=*/true);
    ASSERT_TRUE(ok.ok()) << doc << ok.status().ToString();
    EXPECT_TRUE(ok->unimplemented.empty()) << doc;
  }
  EXPECT_THAT(Refusal(R"({"zero_optimization": {"stage": 4}})"),
              HasSubstr("zero_optimization.stage: 4 is out of range; expected an integer from "
                        "0 to 3"));
}

TEST(ConfigTest, WrongTypeIsRefused) {
  std::string m = Refusal(R"({"aio": {"queue_depth": "8"}})");
  EXPECT_THAT(m, HasSubstr("test.json: aio.queue_depth: \"8\" is a string; expected an integer "
                           "from 1 to 4096"));
  m = Refusal(R"({"zero_optimization": {"offload_param": {"pin_memory": 1}}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_param.pin_memory: 1 is an integer; "
                           "expected true or false"));
  m = Refusal(R"({"zero_optimization": {"offload_param": {"buffer_count": 2.5}}})");
  EXPECT_THAT(m, HasSubstr("buffer_count: 2.5 is not an integer"));
  m = Refusal(R"({"optimizer": {"type": "AdamW", "params": {"betas": 0.9}}})");
  EXPECT_THAT(m, HasSubstr("optimizer.params.betas: 0.9 is a number; expected an array of two"));
  m = Refusal(R"({"zero_optimization": 3})");
  EXPECT_THAT(m, HasSubstr("zero_optimization: 3 is an integer; expected an object"));
  m = Refusal(R"({"zero_optimization": {"offload_param": {"device": "disk"}}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_param.device: \"disk\" is not allowed; "
                           "expected one of \"none\", \"cpu\", \"nvme\""));
  m = Refusal(R"({"aio": {"engine": "urin"}})");
  EXPECT_THAT(m, HasSubstr("did you mean \"uring\"?"));
}

TEST(ConfigTest, OutOfRangeValuesAreRefusedAllAtOnce) {
  std::string m = Refusal(R"({
    "aio": {"queue_depth": 0, "block_size": 6144},
    "optimizer": {"type": "AdamW", "params": {"lr": -0.1, "betas": [0.9, 1.0], "eps": 0}},
    "zinf": {"budgets": {"device_bytes": 0}, "pipeline_depth": 65}})");
  EXPECT_EQ(Lines(m), 7u) << m;
  EXPECT_THAT(m, HasSubstr("aio.queue_depth: 0 is out of range; expected an integer from 1 to "
                           "4096"));
  EXPECT_THAT(m, HasSubstr("aio.block_size: 6144 is not allowed; expected a byte size"));
  EXPECT_THAT(m, HasSubstr("power of two from 4K to 1G"));
  EXPECT_THAT(m, HasSubstr("optimizer.params.lr: -0.1 is out of range; expected a number >= 0"));
  EXPECT_THAT(m, HasSubstr("optimizer.params.betas[1]: 1.0 is out of range; expected a number "
                           "in [0, 1)"));
  EXPECT_THAT(m, HasSubstr("optimizer.params.eps: 0 is out of range; expected a number > 0"));
  EXPECT_THAT(m, HasSubstr("zinf.budgets.device_bytes: 0 is not allowed"));
  EXPECT_THAT(m, HasSubstr("zinf.pipeline_depth: 65 is out of range"));
  // Every line names the file.
  std::istringstream lines(m);
  for (std::string line; std::getline(lines, line);) EXPECT_EQ(line.rfind("test.json: ", 0), 0u);

  EXPECT_THAT(Refusal(R"({"aio": {"block_size": 2048}})"), HasSubstr("aio.block_size: 2048"));
}

TEST(ConfigTest, ImpossibleValuesAreRefused) {
  EXPECT_THAT(Refusal(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4,
                          "gradient_accumulation_steps": 8})"),
              HasSubstr("train_batch_size: 30 does not equal train_micro_batch_size_per_gpu 4 * "
                        "gradient_accumulation_steps 8"));
  EXPECT_THAT(Refusal(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})"),
              HasSubstr("train_batch_size: 30 is not a multiple"));
  EXPECT_THAT(Refusal(R"({"zinf": {"model": {"width": 100, "heads": 3}}})"),
              HasSubstr("zinf.model.width: 100 is not divisible by zinf.model.heads 3"));
  EXPECT_THAT(Refusal(R"({"scheduler": {"type": "WarmupLR",
                          "params": {"warmup_min_lr": 0.1, "warmup_max_lr": 0.01}}})"),
              HasSubstr("scheduler.params.warmup_min_lr: 0.1 is above the warmup peak 0.01"));
  EXPECT_THAT(Refusal(R"({"zero_optimization": {"offload_param": {"device": "nvme",
                          "nvme_path": "/x", "buffer_count": 0}}})"),
              HasSubstr("zero_optimization.offload_param.buffer_count: 0 is impossible"));
}

TEST(ConfigTest, ImpossibleBudgetsAreRefusedWithTheNumbers) {
  std::string m = Refusal(R"({
    "zero_optimization": {"offload_optimizer": {"device": "nvme", "nvme_path": "/x"}},
    "aio": {"block_size": "1M"}, "zinf": {"budgets": {"pinned_bytes": "64K"}}})");
  EXPECT_THAT(m, HasSubstr("zinf.budgets.pinned_bytes: 65536"));
  EXPECT_THAT(m, HasSubstr("cannot stage one aio.block_size of 1048576"));

  // A unit larger than the device budget: a block of width 1024 has 12·1024² + 13·1024
  // parameters, 2 bytes each in bf16.
  m = Refusal(R"({"zinf": {"budgets": {"device_bytes": "16M"},
                           "model": {"width": 1024, "heads": 16}}})");
  EXPECT_THAT(m, HasSubstr("zinf.budgets.device_bytes: 16777216"));
  EXPECT_THAT(m, HasSubstr("12596224 parameters * 2 bytes = 25192448"));
  EXPECT_TRUE(Load(R"({"zinf": {"budgets": {"device_bytes": "32M"},
                                "model": {"width": 1024, "heads": 16}}})")
                  .ok());
}

TEST(ConfigTest, MissingNvmePathIsRefused) {
  std::string m = Refusal(R"({"zero_optimization": {"offload_optimizer": {"device": "nvme"}}})");
  EXPECT_THAT(m, HasSubstr("test.json: zero_optimization.offload_optimizer.nvme_path: missing"));
  EXPECT_THAT(m, HasSubstr("device is \"nvme\""));
  m = Refusal(R"({"zero_optimization": {"offload_param": {"device": "nvme", "nvme_path": null}}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.offload_param.nvme_path: missing"));
  // Not needed for the cpu.
  EXPECT_TRUE(Load(R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})").ok());
}

TEST(ConfigTest, MalformedJsonIsRefusedWithLineAndColumn) {
  std::string m = Refusal("{\n  \"aio\": {\n    \"block_size\": 4096,\n  }\n}");
  EXPECT_THAT(m, HasSubstr("test.json:4:3: malformed JSON"));
  m = Refusal("{\"aio\": {\"queue_depth\": 8}");  // unterminated
  EXPECT_THAT(m, HasSubstr("test.json:1:"));
  EXPECT_THAT(m, HasSubstr("malformed JSON"));

  testing::TempDir dir;
  const std::string path = dir / "bad.json";
  std::ofstream(path) << "{\n\n  \"zinf\": {\"seed\": 1,,}\n}\n";
  auto r = Config::FromFile(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr(path + ":3:"));
}

TEST(ConfigTest, DuplicateKeyIsRefused) {
  std::string m = Refusal(R"({"zero_optimization": {"stage": 3, "stage": 2}})");
  EXPECT_THAT(m, HasSubstr("zero_optimization.stage: given twice"));
}

TEST(ConfigTest, Bf16AndFp16BothEnabledAreRefused) {
  std::string m = Refusal(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})");
  EXPECT_THAT(m, HasSubstr("fp16.enabled: true together with bf16.enabled true"));
}

TEST(ConfigTest, UnsupportedOptimizerAndScheduleAreRefused) {
  EXPECT_THAT(Refusal(R"({"optimizer": {"type": "Lamb"}})"),
              HasSubstr("optimizer.type: \"Lamb\" is DeepSpeed's but zinf does not implement it"));
  EXPECT_THAT(Refusal(R"({"optimizer": {"params": {"lr": 0.1}}})"),
              HasSubstr("optimizer.type: missing"));
  EXPECT_THAT(Refusal(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})"),
              HasSubstr("use the top-level gradient_clipping"));
  EXPECT_THAT(Refusal(R"({"scheduler": {"type": "OneCycle", "params": {}}})"),
              HasSubstr("scheduler.type: \"OneCycle\" is DeepSpeed's"));
  EXPECT_THAT(Refusal(R"({"scheduler": {"type": "WarmupLR", "params": {"cos_min_ratio": 0.1}}})"),
              HasSubstr("scheduler.params.cos_min_ratio: applies to WarmupCosineLR only"));
}

TEST(ConfigTest, MissingFileIsNamed) {
  auto r = Config::FromFile("/nonexistent/zinf.json");
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("/nonexistent/zinf.json"));
}

TEST(ConfigTest, ValidateCatchesLaterOverrides) {
  auto r = Load(R"({"zero_optimization": {"offload_param": {"device": "cpu"}}})");
  ASSERT_TRUE(r.ok());
  Config c = *r;
  c.zero.offload_param.device = OffloadDevice::kNvme;  // as a command-line flag would
  Status s = c.Validate();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr("test.json: zero_optimization.offload_param.nvme_path"));
}

}  // namespace
}  // namespace zinf
