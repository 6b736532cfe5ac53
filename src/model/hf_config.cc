// src/model/hf_config.cc — reading a Hugging Face config.json; see hf_config.h.
#include "src/model/hf_config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

namespace zinf::model {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Keys of one JSON object, each error naming the file and the key. A null value is an absent
// key (HF writes "head_dim": null for "the default").
class Keys {
 public:
  Keys(const json& j, std::string file, std::string prefix = "")
      : j_(j), file_(std::move(file)), prefix_(std::move(prefix)) {}

  bool Has(const char* key) const { return j_.contains(key); }
  const json* Find(const char* key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status Bad(const char* key, const json& v, std::string_view expected) const {
    return InvalidArgument(
        fmt::format("{}: \"{}{}\" is {}: {}", file_, prefix_, key, v.dump(), expected));
  }
  Status Missing(const char* key) const {
    return InvalidArgument(
        fmt::format("{}: no \"{}{}\": zinf needs it to know the model's shape", file_, prefix_, key));
  }
  // An integer >= 1; `fallback` when absent (none: required).
  Result<int> Int(const char* key, std::optional<int> fallback = std::nullopt) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    if (!v->is_number_integer() || v->get<int64_t>() < 1 || v->get<int64_t>() > (1 << 30)) {
      return Bad(key, *v, "expected a positive integer");
    }
    return int(v->get<int64_t>());
  }
  Result<double> Num(const char* key, double fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return Bad(key, *v, "expected a number");
    }
    return v->get<double>();
  }
  Result<bool> Bool(const char* key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Bad(key, *v, "expected true or false");
    return v->get<bool>();
  }
  Result<std::string> Str(const char* key, std::string fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return Bad(key, *v, "expected a string");
    return v->get<std::string>();
  }
  const std::string& file() const { return file_; }

 private:
  const json& j_;
  std::string file_;
  std::string prefix_;
};

Result<std::string> Architecture(const Keys& k) {
  if (const json* a = k.Find("architectures")) {
    if (!a->is_array() || a->empty() || !(*a)[0].is_string()) {
      return k.Bad("architectures", *a, "expected a list naming the model class");
    }
    return (*a)[0].get<std::string>();
  }
  // No architectures (a config saved from a bare config class): model_type says the family.
  ZINF_ASSIGN_OR_RETURN(std::string type, k.Str("model_type", ""));
  if (type == "llama") return std::string("LlamaForCausalLM");
  if (type == "mistral") return std::string("MistralForCausalLM");
  if (type == "qwen2") return std::string("Qwen2ForCausalLM");
  if (type == "gpt2") return std::string("GPT2LMHeadModel");
  return InvalidArgument(fmt::format(
      "{}: neither \"architectures\" nor a known \"model_type\" (found \"{}\"); zinf reads "
      "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel",
      k.file(), type));
}

// HF's rope_scaling (or, in newer files, rope_parameters): "default" or "llama3".
Status ReadRope(const Keys& k, ModelShape* s) {
  const char* key = k.Find("rope_parameters") ? "rope_parameters" : "rope_scaling";
  const json* r = k.Find(key);
  if (r == nullptr) return Status::Ok();
  if (!r->is_object()) return k.Bad(key, *r, "expected an object or null");
  const Keys rk(*r, k.file(), std::string(key) + ".");
  // HF moves the older "type" over "rope_type" when a file has both.
  ZINF_ASSIGN_OR_RETURN(std::string type, rk.Str("type", ""));
  if (type.empty()) {
    ZINF_ASSIGN_OR_RETURN(type, rk.Str("rope_type", "default"));
  }
  if (rk.Find("rope_theta") != nullptr) {
    ZINF_ASSIGN_OR_RETURN(s->rope_theta, rk.Num("rope_theta", 0));
  }
  if (type == "default") return Status::Ok();
  if (type != "llama3") {
    return InvalidArgument(fmt::format(
        "{}: \"{}\" of type \"{}\" is not implemented: zinf computes \"default\" and \"llama3\" "
        "(Llama 3.1) rotary embeddings, and will not train with other positions than the "
        "model's",
        k.file(), key, type));
  }
  auto& sc = s->rope_scaling;
  sc.kind = "llama3";
  for (auto [name, out] : {std::pair{"factor", &sc.factor},
                           {"low_freq_factor", &sc.low_freq_factor},
                           {"high_freq_factor", &sc.high_freq_factor},
                           {"original_max_position_embeddings",
                            &sc.original_max_position_embeddings}}) {
    if (rk.Find(name) == nullptr) return rk.Missing(name);
    ZINF_ASSIGN_OR_RETURN(*out, rk.Num(name, 0));
  }
  return Status::Ok();
}

Status ReadLlamaFamily(const Keys& k, const std::string& arch, ModelShape* s) {
  s->arch = Arch::kLlama;
  ZINF_ASSIGN_OR_RETURN(s->hidden, k.Int("hidden_size"));
  ZINF_ASSIGN_OR_RETURN(s->intermediate, k.Int("intermediate_size"));
  ZINF_ASSIGN_OR_RETURN(s->heads, k.Int("num_attention_heads"));
  ZINF_ASSIGN_OR_RETURN(s->layers, k.Int("num_hidden_layers"));
  ZINF_ASSIGN_OR_RETURN(s->vocab, k.Int("vocab_size"));
  const bool llama = arch == "LlamaForCausalLM", mistral = arch == "MistralForCausalLM";
  // Absent, the config class's default (LlamaConfig: the heads; MistralConfig 8; Qwen2Config
  // 32); null, the number of attention heads in all three.
  const int kv_default = !k.Has("num_key_value_heads") && !llama ? (mistral ? 8 : 32) : s->heads;
  ZINF_ASSIGN_OR_RETURN(s->kv_heads, k.Int("num_key_value_heads", kv_default));
  if (k.Find("head_dim") == nullptr && s->hidden % s->heads != 0) {
    return InvalidArgument(fmt::format(
        "{}: hidden_size {} is not a multiple of num_attention_heads {} and there is no "
        "\"head_dim\"",
        k.file(), s->hidden, s->heads));
  }
  ZINF_ASSIGN_OR_RETURN(s->head_dim, k.Int("head_dim", s->hidden / s->heads));
  ZINF_ASSIGN_OR_RETURN(s->norm_eps, k.Num("rms_norm_eps", 1e-6));
  ZINF_ASSIGN_OR_RETURN(s->rope_theta, k.Num("rope_theta", 10000.0));
  ZINF_RETURN_IF_ERROR(ReadRope(k, s));
  ZINF_ASSIGN_OR_RETURN(
      s->max_positions,
      k.Int("max_position_embeddings", llama ? 2048 : mistral ? 4096 * 32 : 32768));
  ZINF_ASSIGN_OR_RETURN(s->tie_word_embeddings, k.Bool("tie_word_embeddings", false));
  if (llama) {
    ZINF_ASSIGN_OR_RETURN(bool bias, k.Bool("attention_bias", false));
    s->qkv_bias = s->o_bias = bias;  // LlamaAttention: q, k, v and o_proj alike
    ZINF_ASSIGN_OR_RETURN(s->mlp_bias, k.Bool("mlp_bias", false));
  } else if (arch == "Qwen2ForCausalLM") {
    s->qkv_bias = true;  // Qwen2Attention: q, k, v with biases, o_proj without
    ZINF_ASSIGN_OR_RETURN(bool window, k.Bool("use_sliding_window", false));
    if (window) {
      return k.Bad("use_sliding_window", true,
                    "zinf attends to every earlier position; a Qwen2 model with sliding-window "
                    "layers is not implemented");
    }
  } else {  // Mistral: its window applies to every layer; absent, MistralConfig's 4096
    if (!k.Has("sliding_window")) s->sliding_window = 4096;
    if (const json* w = k.Find("sliding_window")) {
      if (!w->is_number_integer() || w->get<int64_t>() < 1) {
        return k.Bad("sliding_window", *w, "expected a positive integer or null");
      }
      s->sliding_window = int(std::min<int64_t>(w->get<int64_t>(), 1 << 30));
    }
  }
  ZINF_ASSIGN_OR_RETURN(std::string act, k.Str("hidden_act", "silu"));
  if (act != "silu" && act != "swish") {  // HF's ACT2FN: both are SiLU
    return k.Bad("hidden_act", act, "zinf's MLP is SwiGLU with SiLU (\"silu\") only");
  }
  ZINF_ASSIGN_OR_RETURN(const double dropout, k.Num("attention_dropout", 0.0));
  if (dropout != 0.0) {
    return k.Bad("attention_dropout", dropout, "zinf trains without dropout: expected 0");
  }
  ZINF_ASSIGN_OR_RETURN(double partial, k.Num("partial_rotary_factor", 1.0));
  if (partial != 1.0) {
    return k.Bad("partial_rotary_factor", partial,
                  "zinf rotates the whole head: expected 1");
  }
  if (const json* types = k.Find("layer_types")) {
    for (const json& t : *types) {
      if (t != "full_attention") {
        return k.Bad("layer_types", *types,
                      "zinf computes full attention in every layer: expected every entry "
                      "\"full_attention\"");
      }
    }
  }
  return Status::Ok();
}

Status ReadGpt2(const Keys& k, ModelShape* s, double* dropout) {
  s->arch = Arch::kGpt2;
  ZINF_ASSIGN_OR_RETURN(s->hidden, k.Int("n_embd"));
  ZINF_ASSIGN_OR_RETURN(s->layers, k.Int("n_layer"));
  ZINF_ASSIGN_OR_RETURN(s->heads, k.Int("n_head"));
  ZINF_ASSIGN_OR_RETURN(s->vocab, k.Int("vocab_size"));
  ZINF_ASSIGN_OR_RETURN(s->max_positions, k.Int("n_positions"));
  s->kv_heads = s->heads;
  s->head_dim = s->hidden / s->heads;
  ZINF_ASSIGN_OR_RETURN(s->intermediate, k.Int("n_inner", 4 * s->hidden));
  ZINF_ASSIGN_OR_RETURN(s->norm_eps, k.Num("layer_norm_epsilon", 1e-5));
  if (s->norm_eps != 1e-5) {
    return k.Bad("layer_norm_epsilon", s->norm_eps, "zinf's GPT-2 LayerNorm uses 1e-5");
  }
  ZINF_ASSIGN_OR_RETURN(std::string act, k.Str("activation_function", "gelu_new"));
  if (act != "gelu_new" && act != "gelu_pytorch_tanh") {
    return k.Bad("activation_function", act,
                  "zinf's GPT-2 MLP uses the tanh GELU (\"gelu_new\")");
  }
  ZINF_ASSIGN_OR_RETURN(s->tie_word_embeddings, k.Bool("tie_word_embeddings", true));
  ZINF_ASSIGN_OR_RETURN(bool scale, k.Bool("scale_attn_weights", true));
  ZINF_ASSIGN_OR_RETURN(bool by_layer, k.Bool("scale_attn_by_inverse_layer_idx", false));
  if (!scale || by_layer) {
    return InvalidArgument(fmt::format(
        "{}: scale_attn_weights {} and scale_attn_by_inverse_layer_idx {}: zinf scales GPT-2's "
        "attention by 1/sqrt(head_dim) only (true and false)",
        k.file(), scale, by_layer));
  }
  s->qkv_bias = s->o_bias = s->mlp_bias = true;
  *dropout = 0.0;
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) {
    ZINF_ASSIGN_OR_RETURN(double p, k.Num(key, 0.1));
    *dropout = std::max(*dropout, p);
  }
  return Status::Ok();
}

}  // namespace

Result<HfConfig> ReadHfConfig(const std::string& path_in) {
  fs::path path = path_in;
  std::error_code ec;
  if (fs::is_directory(path, ec)) path /= "config.json";
  HfConfig out;
  out.path = path.string();
  std::ifstream in(path);
  if (!in) {
    return NotFound(fmt::format("Hugging Face config {}: cannot open it ({})", out.path,
                                std::strerror(errno)));
  }
  json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return InvalidArgument(
        fmt::format("Hugging Face config {}: not a JSON object", out.path));
  }
  const Keys k(j, out.path);
  ZINF_ASSIGN_OR_RETURN(std::string arch, Architecture(k));
  ModelShape& s = out.shape;
  s.hf_architecture = arch;
  if (arch == "LlamaForCausalLM" || arch == "MistralForCausalLM" || arch == "Qwen2ForCausalLM") {
    ZINF_RETURN_IF_ERROR(ReadLlamaFamily(k, arch, &s));
  } else if (arch == "GPT2LMHeadModel") {
    ZINF_RETURN_IF_ERROR(ReadGpt2(k, &s, &out.gpt2_dropout));
  } else {
    return InvalidArgument(fmt::format(
        "{}: architecture \"{}\" is not one zinf computes; it reads LlamaForCausalLM, "
        "MistralForCausalLM, Qwen2ForCausalLM and GPT2LMHeadModel",
        out.path, arch));
  }
  ZINF_ASSIGN_OR_RETURN(s.torch_dtype, k.Str(k.Find("dtype") ? "dtype" : "torch_dtype", ""));
  if (Status c = s.Check(); !c.ok()) return c.WithContext(out.path);
  return out;
}

}  // namespace zinf::model
