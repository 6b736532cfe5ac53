// The model seam (src/train/model.h): the published presets through zinf.model and back give
// the parameter counts HF's models have, in the seam, in ModelConfig's own arithmetic and in
// the units; a config's Llama keys reach the shape; ResidentForwardBackward over the seam is the
// family's arithmetic (the tests of gpt.h and llama.h run through it).
#include "src/train/model.h"

#include <gtest/gtest.h>

#include "src/model/model_shape.h"

namespace zinf::train {
namespace {

TEST(ModelTest, EveryPresetThroughTheConfigKeepsItsShape) {
  for (const std::string& name : model::PresetNames()) {
    auto shape = model::Preset(name);
    ASSERT_TRUE(shape.ok()) << name;
    const ModelConfig mc = ModelConfigOf(*shape, 512);
    auto m = Model::FromConfig(mc);
    ASSERT_TRUE(m.ok()) << name << ": " << m.status().ToString();
    EXPECT_EQ(m->arch(), shape->arch) << name;
    EXPECT_EQ(m->TotalParams(), shape->Params()) << name;
    EXPECT_EQ(mc.TotalParams(), shape->Params()) << name;  // the config's own count agrees
    EXPECT_EQ(mc.LargestUnitParams(), m->MaxUnitParams()) << name;
    uint64_t tensors = 0;
    for (uint32_t u = 0; u < m->units(); ++u) {
      for (const TensorInfo& t : m->UnitTensors(u)) tensors += t.elems;
    }
    EXPECT_EQ(tensors, shape->Params()) << name;
    if (shape->arch == model::Arch::kLlama) {
      const model::ModelShape& s = m->llama().shape;
      EXPECT_EQ(s.kv_heads, shape->kv_heads) << name;
      EXPECT_EQ(s.head_dim, shape->head_dim) << name;
      EXPECT_EQ(s.rope_theta, shape->rope_theta) << name;
      EXPECT_EQ(s.rope_scaling.kind, shape->rope_scaling.kind) << name;
      EXPECT_EQ(s.qkv_bias, shape->qkv_bias) << name;
      EXPECT_EQ(s.tie_word_embeddings, shape->tie_word_embeddings) << name;
      EXPECT_EQ(m->seq(), 512) << name;  // the training length, not max_position_embeddings
    } else {
      EXPECT_EQ(m->seq(), shape->max_positions) << name;  // GPT-2's positions are parameters
    }
  }
}

TEST(ModelTest, LlamaConfigReachesTheShapeAndBadOnesAreRefused) {
  ModelConfig mc{.arch = "llama", .layers = 2, .width = 64, .heads = 4, .seq_len = 32,
                 .vocab = 100, .kv_heads = 2, .intermediate = 96};
  mc.head_dim = 8;  // not width/heads
  mc.qkv_bias = true;
  mc.rope_scaling = {.type = "llama3", .factor = 8, .original_max_position_embeddings = 16};
  auto m = Model::FromConfig(mc);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->llama().shape.head_dim, 8);
  EXPECT_EQ(m->UnitParams(1), mc.BlockParams());
  EXPECT_EQ(m->UnitTensors(1)[4].name, "model.layers.0.self_attn.q_proj.bias");
  EXPECT_NE(m->Describe().find("head_dim 8"), std::string::npos) << m->Describe();
  mc.rope_scaling.type = "yarn";
  auto bad = Model::FromConfig(mc);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().ToString().find("yarn"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace zinf::train
