// src/model/hf_config.h — a Hugging Face model's config.json read into a ModelShape.
//
// Contract. ReadHfConfig(path) takes a config.json or the directory holding one. It accepts the
// `architectures` zinf computes exactly: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM
// and GPT2LMHeadModel. Keys keep Hugging Face's meaning, and a key that is absent takes the
// default of HF's config class for that architecture (all three Llama-family classes:
// rms_norm_eps 1e-6, rope_theta 10000, head_dim = hidden_size/num_attention_heads,
// tie_word_embeddings false; num_key_value_heads = num_attention_heads for LlamaConfig, 8 for
// MistralConfig, 32 for Qwen2Config (null means num_attention_heads in all three);
// max_position_embeddings 2048, 131072, 32768; Mistral's sliding_window 4096 (null: none);
// GPT2Config: n_inner 4·n_embd, layer_norm_epsilon 1e-5, tied). When a rope_scaling has both
// "type" and "rope_type", "type" wins, as in HF. The sizes that have no sensible default (hidden_size,
// intermediate_size, num_attention_heads, num_hidden_layers, vocab_size; GPT-2's n_embd,
// n_layer, n_head, vocab_size, n_positions) must be there.
//
// What zinf cannot compute as HF does is refused before anything is loaded, naming the file,
// the key, what it holds and what zinf expects: another architecture, `rope_scaling` of a type
// other than "llama3" (or "default"), an activation other than SiLU (GPT-2: "gelu_new", its
// tanh GELU), attention dropout above 0 for the Llama family, `partial_rotary_factor` below 1,
// sliding-window layers in Qwen2 (`use_sliding_window`), an untied GPT-2 head. Mistral's
// `sliding_window` is kept: ModelShape::CheckSequence refuses a longer sequence. GPT-2's
// dropout probabilities (resid_pdrop, embd_pdrop, attn_pdrop; HF's default 0.1) are returned in
// `gpt2_dropout` for the trainer to decide on: zinf trains without dropout.
//
// Thread-safety: reads the file; no shared state.
#pragma once

#include <string>

#include "src/model/model_shape.h"
#include "zinf/status.h"

namespace zinf::model {

struct HfConfig {
  ModelShape shape;
  double gpt2_dropout = 0.0;  // the largest of GPT-2's three dropout probabilities
  std::string path;           // the config.json read
};

Result<HfConfig> ReadHfConfig(const std::string& path);

}  // namespace zinf::model
