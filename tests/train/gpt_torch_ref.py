#!/usr/bin/python3
"""The reference for gpt_torch_test: nanoGPT's GPT (model.py, Karpathy) in PyTorch, float64.

For each CASE given, reads from DIR
  CASE.weights.safetensors  the model's tensors under nanoGPT's state_dict names, F64 or F32;
                            __metadata__ holds n_layer, n_head, n_embd, vocab_size, block_size
  CASE.batch.safetensors    tokens and targets, I32 (B, T)
and writes
  CASE.grads.safetensors    "loss" (F64 scalar, mean cross-entropy) and, under each parameter's
                            name, its gradient (F64), lm_head's included in wte's (tied)

usage: gpt_torch_ref.py DIR CASE...
Exit status 77 when torch cannot be imported, so the test can skip; 1 when the files do not
describe nanoGPT's model exactly (a name missing or extra, a shape that differs).

The safetensors module is not installed here, so the format (8-byte little-endian header length,
a JSON header, the raw little-endian bytes) is read and written by hand.
"""
import json
import math
import os
import struct
import sys


def read_safetensors(path, torch):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    buf = blob[8 + n:]
    dtypes = {"F64": torch.float64, "F32": torch.float32, "I32": torch.int32,
              "I64": torch.int64}
    meta = header.pop("__metadata__", {})
    tensors = {}
    for name, e in header.items():
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(buf[b:end]), dtype=dtypes[e["dtype"]])
        tensors[name] = t.reshape(e["shape"]).clone()
    return tensors, meta


def write_safetensors(path, tensors):
    """tensors: name -> float64 tensor. Packed in name order, header padded to 8 bytes."""
    header, chunks, off = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to("cpu").contiguous().double().numpy().astype("<f8")
        raw = data.tobytes()
        header[name] = {"dtype": "F64", "shape": list(tensors[name].shape),
                        "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


def build_model(torch, n_layer, n_head, n_embd, vocab_size, block_size):
    nn = torch.nn
    F = torch.nn.functional

    # nanoGPT model.py, as it stands (bias=True, dropout=0, no flash attention in torch 1.13).
    class LayerNorm(nn.Module):
        def __init__(self, ndim):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(ndim))
            self.bias = nn.Parameter(torch.zeros(ndim))

        def forward(self, x):
            return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)

    class CausalSelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.c_proj = nn.Linear(n_embd, n_embd)
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size))
                                 .view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(n_embd, dim=2)
            k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
            q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
            v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.c_proj(y)

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = nn.Linear(n_embd, 4 * n_embd)
            self.c_proj = nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            # nanoGPT uses nn.GELU() (erf); GPT-2 itself, llm.c and zinf use the tanh form.
            return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = LayerNorm(n_embd)
            self.attn = CausalSelfAttention()
            self.ln_2 = LayerNorm(n_embd)
            self.mlp = MLP()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(vocab_size, n_embd),
                wpe=nn.Embedding(block_size, n_embd),
                h=nn.ModuleList([Block() for _ in range(n_layer)]),
                ln_f=LayerNorm(n_embd),
            ))
            self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying

        def forward(self, idx, targets):
            b, t = idx.size()
            pos = torch.arange(0, t, dtype=torch.long)
            x = self.transformer.wte(idx) + self.transformer.wpe(pos)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                   ignore_index=-1)

    return GPT()


def run_case(torch, d, case):
    weights, meta = read_safetensors(os.path.join(d, case + ".weights.safetensors"), torch)
    batch, _ = read_safetensors(os.path.join(d, case + ".batch.safetensors"), torch)
    dims = {k: int(meta[k]) for k in ("n_layer", "n_head", "n_embd", "vocab_size", "block_size")}
    model = build_model(torch, **dims).double()
    params = dict(model.named_parameters())  # the tied wte/lm_head appears once, as wte
    want = set(params)
    got = set(weights)
    if want != got:
        print(f"gpt_torch_ref.py: {case}: names missing {sorted(want - got)}, "
              f"unexpected {sorted(got - want)}", file=sys.stderr)
        return 1
    with torch.no_grad():
        for name, p in params.items():
            w = weights[name]
            if tuple(w.shape) != tuple(p.shape):
                print(f"gpt_torch_ref.py: {case}: {name} has shape {tuple(w.shape)}, nanoGPT's "
                      f"is {tuple(p.shape)}", file=sys.stderr)
                return 1
            p.copy_(w.double())
    tokens = batch["tokens"].long()
    targets = batch["targets"].long()
    loss = model(tokens, targets)
    loss.backward()
    out = {"loss": loss.detach()}
    for name, p in params.items():
        out[name] = p.grad
    write_safetensors(os.path.join(d, case + ".grads.safetensors"), out)
    return 0


def main():
    try:
        import torch
    except ImportError as e:  # the test turns this into a skip
        print(f"gpt_torch_ref.py: {e}", file=sys.stderr)
        return 77
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    if sys.byteorder != "little":
        print("gpt_torch_ref.py: big-endian host", file=sys.stderr)
        return 1
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    for case in sys.argv[2:]:
        rc = run_case(torch, sys.argv[1], case)
        if rc != 0:
            return rc
    return 0


if __name__ == "__main__":
    sys.exit(main())
