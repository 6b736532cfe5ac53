#!/usr/bin/python3
"""One Llama decoder layer as Hugging Face's LlamaForCausalLM computes it (modeling_llama.py:
LlamaRMSNorm, rotate_half / apply_rotary_pos_emb, repeat_kv, the eager attention, LlamaMLP, and
the rope parameters of modeling_rope_utils.py, "default" and "llama3"), written independently
of zinf, forward and backward through torch.autograd in float32.

usage: torch_llama_layer_ref.py DIR...   (one case a directory)
  DIR/case.json: {"B", "seq", "hidden", "heads", "kv_heads", "head_dim", "intermediate",
                  "rms_norm_eps", "rope_theta", "rope_scaling" (null or HF's dict),
                  "qkv_bias", "o_bias"}
  in (raw little-endian float32): x [B,seq,hidden], input_layernorm, q_proj, k_proj, v_proj,
      o_proj, post_attention_layernorm, gate_proj, up_proj, down_proj (nn.Linear [out, in]),
      q_bias, k_bias, v_bias (with qkv_bias: Qwen2's, and Llama's attention_bias), o_bias (with
      o_bias: Llama's attention_bias), dy [B,seq,hidden]
  out: y.out, and d_<name>.out for x and every weight: ∂(Σ y·dy)/∂name
Exit status 77 when torch (or numpy) cannot be imported, so the test can skip.
"""
import json
import math
import os
import sys


def main():
    try:
        import numpy as np
        import torch
    except ImportError as e:  # the test turns this into a skip
        print(f"torch_llama_layer_ref.py: {e}", file=sys.stderr)
        return 77
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    for d in sys.argv[1:]:
        status = run_case(d, np, torch)
        if status != 0:
            return status
    return 0


def run_case(d, np, torch):
    cfg = json.load(open(os.path.join(d, "case.json")))
    B, T, C = cfg["B"], cfg["seq"], cfg["hidden"]
    H, KV, hd, I = cfg["heads"], cfg["kv_heads"], cfg["head_dim"], cfg["intermediate"]

    shapes = {
        "x": (B, T, C), "input_layernorm": (C,), "q_proj": (H * hd, C), "k_proj": (KV * hd, C),
        "v_proj": (KV * hd, C), "o_proj": (C, H * hd), "post_attention_layernorm": (C,),
        "gate_proj": (I, C), "up_proj": (I, C), "down_proj": (C, I), "dy": (B, T, C),
    }
    if cfg["qkv_bias"]:
        shapes.update({"q_bias": (H * hd,), "k_bias": (KV * hd,), "v_bias": (KV * hd,)})
    if cfg["o_bias"]:
        shapes["o_bias"] = (C,)
    t = {}
    for name, shape in shapes.items():
        n = math.prod(shape)
        a = np.fromfile(os.path.join(d, name), dtype="<f4", count=n)
        if a.size != n:
            print(f"{name}: {a.size} values, expected {n}", file=sys.stderr)
            return 2
        t[name] = torch.tensor(a.reshape(shape), requires_grad=(name != "dy"))

    # modeling_rope_utils: _compute_default_rope_parameters, _compute_llama3_parameters.
    base = cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    rs = cfg["rope_scaling"]
    if rs is not None:
        assert rs["rope_type"] == "llama3"
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old_len = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        inv_llama = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv_freq = torch.where(medium, smoothed, inv_llama)
    # LlamaRotaryEmbedding.forward
    position_ids = torch.arange(T)[None, :]
    inv_freq_expanded = inv_freq[None, :, None].float().expand(1, -1, 1)
    freqs = (inv_freq_expanded.float() @ position_ids[:, None, :].float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rms_norm(x, w):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
        return w * (x * torch.rsqrt(variance + cfg["rms_norm_eps"]))

    def rotate_half(x):
        x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
        return torch.cat((-x2, x1), dim=-1)

    def repeat_kv(x, n_rep):
        b, kv, s, dim = x.shape
        if n_rep == 1:
            return x
        return x[:, :, None, :, :].expand(b, kv, n_rep, s, dim).reshape(b, kv * n_rep, s, dim)

    def linear(x, name):
        bias = t.get(name.replace("_proj", "_bias"))  # None where the case has none
        return torch.nn.functional.linear(x, t[name], bias)

    x = t["x"]
    h = rms_norm(x, t["input_layernorm"])
    q = linear(h, "q_proj").view(B, T, H, hd).transpose(1, 2)
    k = linear(h, "k_proj").view(B, T, KV, hd).transpose(1, 2)
    v = linear(h, "v_proj").view(B, T, KV, hd).transpose(1, 2)
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    q, k = (q * c) + (rotate_half(q) * s), (k * c) + (rotate_half(k) * s)
    k, v = repeat_kv(k, H // KV), repeat_kv(v, H // KV)
    scores = torch.matmul(q, k.transpose(2, 3)) * hd ** -0.5
    mask = torch.full((T, T), float("-inf")).triu(1)
    probs = torch.softmax(scores + mask, dim=-1, dtype=torch.float32)
    attn = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, H * hd)
    x = x + linear(attn, "o_proj")
    h = rms_norm(x, t["post_attention_layernorm"])
    y = x + linear(torch.nn.functional.silu(linear(h, "gate_proj")) * linear(h, "up_proj"),
                   "down_proj")
    (y * t["dy"]).sum().backward()

    y.detach().numpy().astype("<f4").tofile(os.path.join(d, "y.out"))
    for name, tensor in t.items():
        if name != "dy":
            tensor.grad.numpy().astype("<f4").tofile(os.path.join(d, f"d_{name}.out"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
