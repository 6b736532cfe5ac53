// src/model/model_shape.cc — ModelShape's checks and counts, and the presets; see model_shape.h.
#include "src/model/model_shape.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>

namespace zinf::model {

std::string_view ArchName(Arch a) { return a == Arch::kGpt2 ? "gpt2" : "llama"; }

Status ModelShape::Check() const {
  const std::pair<const char*, int> sizes[] = {
      {"layers", layers},       {"hidden", hidden}, {"heads", heads},
      {"kv_heads", kv_heads},   {"head_dim", head_dim}, {"intermediate", intermediate},
      {"vocab", vocab}};
  for (auto [name, v] : sizes) {
    if (v <= 0) return InvalidArgument(fmt::format("model shape: {} = {}: expected > 0", name, v));
  }
  if (heads % kv_heads != 0) {
    return InvalidArgument(fmt::format(
        "model shape: {} attention heads are not a multiple of {} key/value heads", heads,
        kv_heads));
  }
  if (!(norm_eps > 0)) {
    return InvalidArgument(fmt::format("model shape: norm eps {}: expected > 0", norm_eps));
  }
  if (arch == Arch::kGpt2) {
    if (kv_heads != heads || head_dim * heads != hidden || intermediate != 4 * hidden ||
        !tie_word_embeddings || max_positions <= 0) {
      return InvalidArgument(fmt::format(
          "model shape: GPT-2 has kv_heads = heads, head_dim = hidden/heads, an MLP 4·hidden "
          "wide, a tied head and a positive number of positions; got heads {}, kv_heads {}, "
          "head_dim {}, hidden {}, intermediate {}, tied {}, positions {}",
          heads, kv_heads, head_dim, hidden, intermediate, tie_word_embeddings, max_positions));
    }
    return Status::Ok();
  }
  if (head_dim % 2 != 0) {
    return InvalidArgument(
        fmt::format("model shape: head_dim {} must be even (rotary embeddings)", head_dim));
  }
  return kernels::cpu::RopeInvFreq(head_dim, rope_theta, rope_scaling).status();
}

Status ModelShape::CheckSequence(int seq_len) const {
  if (arch == Arch::kGpt2 && seq_len > max_positions) {
    return InvalidArgument(fmt::format(
        "sequence length {} is longer than the model's {} positions", seq_len, max_positions));
  }
  if (sliding_window > 0 && seq_len > sliding_window) {
    return InvalidArgument(fmt::format(
        "sequence length {} is longer than the model's sliding window of {}: zinf attends to "
        "every earlier position, which is what {} computes only up to the window; use "
        "--seq-len {} or less",
        seq_len, sliding_window, hf_architecture.empty() ? "the model" : hf_architecture,
        sliding_window));
  }
  return Status::Ok();
}

uint64_t ModelShape::EmbeddingParams() const {
  const uint64_t C = hidden;
  return uint64_t(vocab) * C + (arch == Arch::kGpt2 ? uint64_t(max_positions) * C : 0);
}

uint64_t ModelShape::LayerParams() const {
  const uint64_t C = hidden, I = intermediate;
  const uint64_t q = uint64_t(heads) * head_dim, kv = uint64_t(kv_heads) * head_dim;
  if (arch == Arch::kGpt2) return 12 * C * C + 13 * C;  // ln 2C·2, qkv 3C²+3C, proj, fc, proj
  uint64_t n = C * (q + 2 * kv) + q * C + 3 * C * I + 2 * C;  // q,k,v, o, gate/up/down, 2 norms
  if (qkv_bias) n += q + 2 * kv;
  if (o_bias) n += C;
  if (mlp_bias) n += 2 * I + C;
  return n;
}

uint64_t ModelShape::FinalParams() const {
  const uint64_t norm = arch == Arch::kGpt2 ? 2 * uint64_t(hidden) : uint64_t(hidden);
  return norm + (tie_word_embeddings ? 0 : uint64_t(vocab) * hidden);
}

uint64_t ModelShape::Params() const {
  return EmbeddingParams() + uint64_t(layers) * LayerParams() + FinalParams();
}

namespace {

struct PresetRow {
  const char* name;
  Arch arch;
  const char* hf_architecture;
  int layers, hidden, heads, kv_heads, intermediate, vocab, max_positions;
  double norm_eps, rope_theta;
  bool tied, qkv_bias;
  int sliding_window;
};

// From each model's published config.json (head_dim = hidden/heads in all of them).
constexpr std::array<PresetRow, 10> kPresets = {{
    {"tinyllama-1.1b", Arch::kLlama, "LlamaForCausalLM", 22, 2048, 32, 4, 5632, 32000, 2048,
     1e-5, 10000.0, false, false, 0},
    {"llama2-7b", Arch::kLlama, "LlamaForCausalLM", 32, 4096, 32, 32, 11008, 32000, 4096, 1e-5,
     10000.0, false, false, 0},
    {"llama2-13b", Arch::kLlama, "LlamaForCausalLM", 40, 5120, 40, 40, 13824, 32000, 4096, 1e-5,
     10000.0, false, false, 0},
    {"llama3-8b", Arch::kLlama, "LlamaForCausalLM", 32, 4096, 32, 8, 14336, 128256, 8192, 1e-5,
     500000.0, false, false, 0},
    {"mistral-7b", Arch::kLlama, "MistralForCausalLM", 32, 4096, 32, 8, 14336, 32000, 32768,
     1e-5, 10000.0, false, false, 4096},
    {"qwen2.5-0.5b", Arch::kLlama, "Qwen2ForCausalLM", 24, 896, 14, 2, 4864, 151936, 32768, 1e-6,
     1000000.0, true, true, 0},
    {"gpt2", Arch::kGpt2, "GPT2LMHeadModel", 12, 768, 12, 12, 3072, 50257, 1024, 1e-5, 0, true,
     true, 0},
    {"gpt2-medium", Arch::kGpt2, "GPT2LMHeadModel", 24, 1024, 16, 16, 4096, 50257, 1024, 1e-5, 0,
     true, true, 0},
    {"gpt2-large", Arch::kGpt2, "GPT2LMHeadModel", 36, 1280, 20, 20, 5120, 50257, 1024, 1e-5, 0,
     true, true, 0},
    {"gpt2-xl", Arch::kGpt2, "GPT2LMHeadModel", 48, 1600, 25, 25, 6400, 50257, 1024, 1e-5, 0,
     true, true, 0},
}};

}  // namespace

Result<ModelShape> Preset(std::string_view name) {
  for (const PresetRow& r : kPresets) {
    if (name != r.name) continue;
    ModelShape s;
    s.arch = r.arch;
    s.hf_architecture = r.hf_architecture;
    s.layers = r.layers;
    s.hidden = r.hidden;
    s.heads = r.heads;
    s.kv_heads = r.kv_heads;
    s.head_dim = r.hidden / r.heads;
    s.intermediate = r.intermediate;
    s.vocab = r.vocab;
    s.max_positions = r.max_positions;
    s.norm_eps = r.norm_eps;
    s.rope_theta = r.arch == Arch::kLlama ? r.rope_theta : 10000.0;
    s.tie_word_embeddings = r.tied;
    s.qkv_bias = r.qkv_bias;
    s.o_bias = r.arch == Arch::kGpt2;
    s.mlp_bias = r.arch == Arch::kGpt2;
    s.sliding_window = r.sliding_window;
    return s;
  }
  return NotFound(fmt::format("no model preset \"{}\"; the presets are {}", name,
                              fmt::join(PresetNames(), ", ")));
}

std::vector<std::string> PresetNames() {
  std::vector<std::string> names;
  for (const PresetRow& r : kPresets) names.emplace_back(r.name);
  return names;
}

}  // namespace zinf::model
