// Tests of src/model/hf_config.h: the published config.json of each family read into the shape
// of its preset, HF's defaults for absent keys, and every refusal naming the file and the key.
#include "src/model/hf_config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace zinf::model {
namespace {

namespace fs = std::filesystem;

class HfConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("zinf_hf_config_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // Writes text as DIR/name/config.json and returns that directory.
  std::string Write(const std::string& name, const std::string& text) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    std::ofstream(d / "config.json") << text;
    return d.string();
  }
  // The error ReadHfConfig gives for text; fails the test when it is accepted.
  std::string Error(const std::string& text) {
    auto r = ReadHfConfig(Write("bad" + std::to_string(++n_), text));
    EXPECT_FALSE(r.ok()) << text;
    return r.ok() ? "" : r.status().message();
  }
  fs::path dir_;
  int n_ = 0;
};

void ExpectSameShape(const ModelShape& a, const ModelShape& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.hf_architecture, b.hf_architecture);
  EXPECT_EQ(a.layers, b.layers);
  EXPECT_EQ(a.hidden, b.hidden);
  EXPECT_EQ(a.heads, b.heads);
  EXPECT_EQ(a.kv_heads, b.kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.intermediate, b.intermediate);
  EXPECT_EQ(a.vocab, b.vocab);
  EXPECT_EQ(a.max_positions, b.max_positions);
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.kind, b.rope_scaling.kind);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
  EXPECT_EQ(a.o_bias, b.o_bias);
  EXPECT_EQ(a.mlp_bias, b.mlp_bias);
  EXPECT_EQ(a.sliding_window, b.sliding_window);
  EXPECT_EQ(a.Params(), b.Params());
}

// TinyLlama/TinyLlama-1.1B-Chat-v1.0's config.json.
constexpr const char* kTinyLlama = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 1,
  "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
  "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.35.0",
  "use_cache": true, "vocab_size": 32000})";

TEST_F(HfConfigTest, TinyLlamaIsItsPreset) {
  auto r = ReadHfConfig(Write("tiny", kTinyLlama));
  ASSERT_TRUE(r.ok()) << r.status().message();
  auto preset = Preset("tinyllama-1.1b");
  ASSERT_TRUE(preset.ok());
  ExpectSameShape(r->shape, *preset);
  EXPECT_EQ(r->shape.torch_dtype, "bfloat16");
  // The file itself names the same thing.
  auto file = ReadHfConfig((fs::path(Write("tiny_file", kTinyLlama)) / "config.json").string());
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(file->shape.Params(), 1100048384u);
}

TEST_F(HfConfigTest, QwenAndMistralAndGpt2AreTheirPresets) {
  // Qwen/Qwen2.5-0.5B: q/k/v biases though the file says nothing of them; tied.
  auto qwen = ReadHfConfig(Write("qwen", R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "hidden_act": "silu",
    "hidden_size": 896, "intermediate_size": 4864, "max_position_embeddings": 32768,
    "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": true,
    "torch_dtype": "bfloat16", "use_sliding_window": false, "vocab_size": 151936})"));
  ASSERT_TRUE(qwen.ok()) << qwen.status().message();
  ExpectSameShape(qwen->shape, *Preset("qwen2.5-0.5b"));
  // mistralai/Mistral-7B-v0.1: a 4096 sliding window.
  auto mistral = ReadHfConfig(Write("mistral", R"({
    "architectures": ["MistralForCausalLM"], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})"));
  ASSERT_TRUE(mistral.ok()) << mistral.status().message();
  ExpectSameShape(mistral->shape, *Preset("mistral-7b"));
  // openai-community/gpt2 (dropout 0.1, returned for the trainer to decide on).
  auto gpt2 = ReadHfConfig(Write("gpt2", R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.1, "embd_pdrop": 0.1, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257})"));
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().message();
  ExpectSameShape(gpt2->shape, *Preset("gpt2"));
  EXPECT_EQ(gpt2->gpt2_dropout, 0.1);
}

// Llama 3.1's rope_scaling, and the newer rope_parameters spelling of the same.
TEST_F(HfConfigTest, Llama3RopeScalingIsRead) {
  const std::string head = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "vocab_size": 128256, )";
  for (const std::string& rope :
       {std::string(R"("rope_theta": 500000.0, "rope_scaling": {"factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}})"),
        std::string(R"("rope_parameters": {"rope_theta": 500000.0, "factor": 8.0,
          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}})")}) {
    auto r = ReadHfConfig(Write("llama31_" + std::to_string(rope.size()), head + rope));
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->shape.rope_theta, 500000.0);
    EXPECT_EQ(r->shape.rope_scaling.kind, "llama3");
    EXPECT_EQ(r->shape.rope_scaling.factor, 8.0);
    EXPECT_EQ(r->shape.rope_scaling.high_freq_factor, 4.0);
    EXPECT_EQ(r->shape.rope_scaling.original_max_position_embeddings, 8192.0);
    EXPECT_EQ(r->shape.Params(), 8030261248u);
  }
}

// Absent keys take LlamaConfig's defaults; null is absent.
TEST_F(HfConfigTest, AbsentKeysTakeHfDefaults) {
  auto r = ReadHfConfig(Write("minimal", R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_attention_heads": 4, "num_hidden_layers": 2,
    "vocab_size": 100, "head_dim": null, "num_key_value_heads": null})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelShape& s = r->shape;
  EXPECT_EQ(s.hf_architecture, "LlamaForCausalLM");
  EXPECT_EQ(s.kv_heads, 4);
  EXPECT_EQ(s.head_dim, 16);
  EXPECT_EQ(s.norm_eps, 1e-6);
  EXPECT_EQ(s.rope_theta, 10000.0);
  EXPECT_EQ(s.max_positions, 2048);
  EXPECT_FALSE(s.tie_word_embeddings);
  EXPECT_FALSE(s.qkv_bias || s.o_bias || s.mlp_bias);
  EXPECT_EQ(s.rope_scaling.kind, "default");
  // Llama's attention_bias puts a bias on q, k, v and o_proj; mlp_bias on the MLP's three.
  auto b = ReadHfConfig(Write("bias", R"({"model_type": "llama", "hidden_size": 64,
    "intermediate_size": 160, "num_attention_heads": 4, "num_hidden_layers": 2,
    "vocab_size": 100, "attention_bias": true, "mlp_bias": true, "head_dim": 32})"));
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_TRUE(b->shape.qkv_bias && b->shape.o_bias && b->shape.mlp_bias);
  EXPECT_EQ(b->shape.head_dim, 32);
}

// Mistral's and Qwen2's config classes have their own defaults: absent key/value heads are 8
// and 32 (null: the attention heads), Mistral's window 4096 (null: none) and its positions
// 4096·32; "swish" is SiLU.
TEST_F(HfConfigTest, MistralAndQwen2DefaultsAreTheirClasses) {
  const std::string sizes = R"("hidden_size": 2048, "intermediate_size": 160,
    "num_attention_heads": 32, "num_hidden_layers": 2, "vocab_size": 100)";
  auto m = ReadHfConfig(Write("mistral_min", R"({"model_type": "mistral", )" + sizes + "}"));
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->shape.kv_heads, 8);
  EXPECT_EQ(m->shape.sliding_window, 4096);
  EXPECT_EQ(m->shape.max_positions, 131072);
  auto mn = ReadHfConfig(Write("mistral_null", R"({"model_type": "mistral",
    "num_key_value_heads": null, "sliding_window": null, "hidden_act": "swish", )" + sizes + "}"));
  ASSERT_TRUE(mn.ok()) << mn.status().message();
  EXPECT_EQ(mn->shape.kv_heads, 32);
  EXPECT_EQ(mn->shape.sliding_window, 0);
  EXPECT_TRUE(mn->shape.CheckSequence(100000).ok());
  auto q = ReadHfConfig(Write("qwen_min", R"({"model_type": "qwen2", )" + sizes + "}"));
  ASSERT_TRUE(q.ok()) << q.status().message();
  EXPECT_EQ(q->shape.kv_heads, 32);
  EXPECT_EQ(q->shape.max_positions, 32768);
  EXPECT_TRUE(q->shape.qkv_bias);
  EXPECT_FALSE(q->shape.o_bias);
}

TEST_F(HfConfigTest, WhatZinfCannotComputeIsRefusedNamingFileAndKey) {
  const std::string llama = R"({"architectures": ["LlamaForCausalLM"], "hidden_size": 64,
    "intermediate_size": 160, "num_attention_heads": 4, "num_hidden_layers": 2, )";
  struct Case {
    std::string text, want;
  };
  const Case cases[] = {
      {llama + R"("vocab_size": 100, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})",
       "\"rope_scaling\" of type \"yarn\" is not implemented"},
      {llama + R"("vocab_size": 100, "rope_scaling": {"type": "linear", "factor": 2.0}})",
       "type \"linear\""},
      {llama + R"("vocab_size": 100, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}})",
       "no \"rope_scaling.low_freq_factor\""},
      {llama + R"("vocab_size": 100, "rope_scaling": {"rope_type": "llama3", "type": "linear",
          "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}})",
       "type \"linear\""},  // HF lets the older "type" win
      {llama + R"("vocab_size": 100, "hidden_act": "gelu"})", "\"hidden_act\" is \"gelu\""},
      {llama + R"("vocab_size": 100, "attention_dropout": 0.1})", "\"attention_dropout\" is 0.1"},
      {llama + R"("vocab_size": 100, "partial_rotary_factor": 0.5})", "partial_rotary_factor"},
      {llama + R"("vocab_size": 100, "num_key_value_heads": 3})", "key/value heads"},
      {llama + R"("vocab_size": "100"})", "\"vocab_size\" is \"100\": expected a positive integer"},
      {llama + R"("vocab_size": 100, "layer_types": ["full_attention", "sliding_attention"]})",
       "\"layer_types\""},
      {llama + R"("num_key_value_heads": 2})", "no \"vocab_size\""},
      {R"({"architectures": ["Qwen2ForCausalLM"], "hidden_size": 64, "intermediate_size": 160,
          "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100,
          "use_sliding_window": true})",
       "\"use_sliding_window\" is true"},
      {R"({"architectures": ["FalconForCausalLM"], "hidden_size": 64})",
       "architecture \"FalconForCausalLM\" is not one zinf computes"},
      {R"({"model_type": "bert"})", "neither \"architectures\" nor a known \"model_type\""},
      {R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
          "vocab_size": 100, "n_positions": 32, "tie_word_embeddings": false})",
       "tied head"},
      {R"({"architectures": ["GPT2LMHeadModel"], "n_embd": 64, "n_layer": 2, "n_head": 4,
          "vocab_size": 100, "n_positions": 32, "activation_function": "relu"})",
       "\"activation_function\" is \"relu\""},
      {"not json", "not a JSON object"},
  };
  for (const Case& c : cases) {
    const std::string e = Error(c.text);
    EXPECT_NE(e.find(c.want), std::string::npos) << "got: " << e << "\nwant: " << c.want;
    EXPECT_NE(e.find("config.json"), std::string::npos) << e;
  }
  auto missing = ReadHfConfig((dir_ / "nothing_here").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("nothing_here"), std::string::npos);
}

}  // namespace
}  // namespace zinf::model
