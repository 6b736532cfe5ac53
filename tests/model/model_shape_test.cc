// Tests of src/model/model_shape.h: every preset's parameter count against the count its
// publisher states (HF's num_parameters() of the released model), the checks, and the
// sliding-window refusal.
#include "src/model/model_shape.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace zinf::model {
namespace {

// model.num_parameters() of the released checkpoints (a tied head counted once).
TEST(ModelShapeTest, PresetsHaveThePublishedParameterCounts) {
  const std::map<std::string, uint64_t> published = {
      {"gpt2", 124439808},          {"gpt2-medium", 354823168},
      {"gpt2-large", 774030080},    {"gpt2-xl", 1557611200},
      {"tinyllama-1.1b", 1100048384}, {"llama2-7b", 6738415616},
      {"llama2-13b", 13015864320},  {"llama3-8b", 8030261248},
      {"mistral-7b", 7241732096},   {"qwen2.5-0.5b", 494032768},
  };
  ASSERT_EQ(PresetNames().size(), published.size());
  for (const std::string& name : PresetNames()) {
    auto s = Preset(name);
    ASSERT_TRUE(s.ok()) << name << ": " << s.status().message();
    EXPECT_TRUE(s->Check().ok()) << name << ": " << s->Check().message();
    EXPECT_EQ(s->Params(), published.at(name)) << name;
  }
}

TEST(ModelShapeTest, AnUnknownPresetNamesTheKnownOnes) {
  auto s = Preset("llama2-70b");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("llama2-70b"), std::string::npos);
  EXPECT_NE(s.status().message().find("tinyllama-1.1b"), std::string::npos);
}

TEST(ModelShapeTest, ChecksNameTheInconsistentField) {
  auto base = Preset("tinyllama-1.1b");
  ASSERT_TRUE(base.ok());
  ModelShape s = *base;
  s.kv_heads = 5;  // 32 heads are no multiple of 5
  EXPECT_NE(s.Check().message().find("key/value heads"), std::string::npos);
  s = *base;
  s.head_dim = 63;
  EXPECT_NE(s.Check().message().find("head_dim 63"), std::string::npos);
  s = *base;
  s.vocab = 0;
  EXPECT_NE(s.Check().message().find("vocab"), std::string::npos);
  s = *base;
  s.rope_scaling.kind = "yarn";
  EXPECT_NE(s.Check().message().find("\"yarn\""), std::string::npos);
  auto gpt = Preset("gpt2");
  ASSERT_TRUE(gpt.ok());
  s = *gpt;
  s.tie_word_embeddings = false;
  EXPECT_FALSE(s.Check().ok());
}

TEST(ModelShapeTest, ASequenceLongerThanTheSlidingWindowIsRefused) {
  auto mistral = Preset("mistral-7b");
  ASSERT_TRUE(mistral.ok());
  EXPECT_TRUE(mistral->CheckSequence(4096).ok());
  Status s = mistral->CheckSequence(4097);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sliding window of 4096"), std::string::npos) << s.message();
  auto gpt = Preset("gpt2");
  ASSERT_TRUE(gpt.ok());
  EXPECT_TRUE(gpt->CheckSequence(1024).ok());
  EXPECT_FALSE(gpt->CheckSequence(1025).ok());
}

// The parts add up, and biases count where HF's modules have them.
TEST(ModelShapeTest, BiasesAndTheHeadCountWhereHfHasThem) {
  auto q = Preset("qwen2.5-0.5b");
  ASSERT_TRUE(q.ok());
  ModelShape s = *q;
  const uint64_t with = s.LayerParams();
  s.qkv_bias = false;
  EXPECT_EQ(with - s.LayerParams(), uint64_t(14 + 2 * 2) * 64);  // q, k, v biases
  s.tie_word_embeddings = false;
  EXPECT_EQ(s.FinalParams(), uint64_t(896) + uint64_t(151936) * 896);
  EXPECT_EQ(s.Params(), s.EmbeddingParams() + 24 * s.LayerParams() + s.FinalParams());
}

}  // namespace
}  // namespace zinf::model
