// src/model/model_shape.h — the shape of a decoder-only language model, whatever its family:
// the dimensions the model code, the planner and the checkpoint readers share, the named presets
// of the common published models, and their parameter counts.
//
// Contract. Two families:
// - kGpt2: GPT-2 as nanoGPT and HF's GPT2LMHeadModel have it (learned positions, LayerNorm with
//   biases, GELU-tanh MLP of width `intermediate` = 4·hidden, biases everywhere, head tied to the
//   token embedding); heads == kv_heads, head_dim = hidden/heads; `max_positions` rows of wpe.
// - kLlama: HF's LlamaForCausalLM and its kin (MistralForCausalLM, Qwen2ForCausalLM): RMSNorm
//   (`norm_eps`), rotary positions (`rope_theta`, `rope_scaling`), grouped-query attention
//   (`kv_heads`, `head_dim`), SwiGLU MLP of width `intermediate`; biases only where `qkv_bias`
//   (Qwen2; Llama's attention_bias), `o_bias` (Llama's attention_bias) and `mlp_bias` say; the
//   head tied to the embedding when `tie_word_embeddings`. `max_positions` is informational (the
//   rotary embedding has no table to outgrow); `sliding_window` (Mistral) 0 means none.
// Check() says whether the numbers are consistent; Params() counts exactly the parameters HF's
// model has (a tied head counted once).
//
// Thread-safety: plain values and pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/llama_ops.h"
#include "zinf/status.h"

namespace zinf::model {

enum class Arch { kGpt2, kLlama };
std::string_view ArchName(Arch a);  // "gpt2", "llama"

struct ModelShape {
  Arch arch = Arch::kGpt2;
  std::string hf_architecture;  // config.json's, e.g. "LlamaForCausalLM" ("" for a preset)
  int layers = 0;
  int hidden = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int intermediate = 0;
  int vocab = 0;
  int max_positions = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  kernels::cpu::RopeScaling rope_scaling;
  bool tie_word_embeddings = true;
  bool qkv_bias = false;
  bool o_bias = false;
  bool mlp_bias = false;
  int sliding_window = 0;
  std::string torch_dtype;  // as config.json states it ("bfloat16"), informational

  // InvalidArgument naming the first inconsistent field: every size positive, heads a multiple
  // of kv_heads, an even head_dim (rotary), GPT-2's fixed structure.
  Status Check() const;
  // Refuses a sequence length that a sliding window (Mistral) would cut: zinf attends to every
  // earlier position, which equals HF's result only while seq_len <= sliding_window.
  Status CheckSequence(int seq_len) const;

  uint64_t EmbeddingParams() const;  // token embedding (+ GPT-2's positions)
  uint64_t LayerParams() const;      // one decoder layer
  uint64_t FinalParams() const;      // final norm + an untied head
  uint64_t Params() const;           // the whole model
};

// The published shapes by name (tinyllama-1.1b, llama2-7b, llama2-13b, llama3-8b, mistral-7b,
// qwen2.5-0.5b, gpt2, gpt2-medium, gpt2-large, gpt2-xl); NotFound names the known ones.
Result<ModelShape> Preset(std::string_view name);
std::vector<std::string> PresetNames();

}  // namespace zinf::model
