#!/usr/bin/python3
"""Train a PyTorch model from a DeepSpeed config with zinf.torch.offload.

    PYTHONPATH=python ZINF_LIBRARY=build/src/capi/libzinf.so \
        /usr/bin/python3 examples/torch_offload.py --config examples/deepspeed_zero3_nvme.json \
        --swap build/torch-swap --steps 12

The config is DeepSpeed's (zero_optimization, optimizer, scheduler, bf16/fp16, batch keys) with
zinf's own block; its nvme_path entries are pointed at --swap here so the example runs anywhere.
The model is a small nanoGPT-style decoder on synthetic counting sequences; every
micro-batch goes through model.backward and model.step, DeepSpeed's engine calls, and an
optimizer step happens at the end of each accumulation window.
"""
import argparse
import json
import math
import os

import torch
import torch.nn.functional as F

import zinf.torch


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(c), torch.nn.LayerNorm(c)
        self.qkv, self.proj = torch.nn.Linear(c, 3 * c), torch.nn.Linear(c, c)
        self.fc, self.out = torch.nn.Linear(c, 4 * c), torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        y = (att.masked_fill(~mask, float("-inf")).softmax(-1) @ v).transpose(1, 2)
        x = x + self.proj(y.reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=256, c=128, heads=4, layers=4, seq=64):
        super().__init__()
        self.wte, self.wpe = torch.nn.Embedding(vocab, c), torch.nn.Embedding(seq, c)
        self.blocks = torch.nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(c)
        self.head = torch.nn.Linear(c, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as nanoGPT does
        for m in self.modules():  # nanoGPT's initialisation
            if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
                torch.nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, torch.nn.Linear) and m.bias is not None:
                torch.nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="examples/deepspeed_zero3_nvme.json")
    ap.add_argument("--swap", default="build/torch-swap")
    ap.add_argument("--steps", type=int, default=12, help="optimizer steps")
    a = ap.parse_args()
    with open(a.config) as f:
        cfg = json.load(f)
    os.makedirs(a.swap, exist_ok=True)
    for key in ("offload_param", "offload_optimizer"):
        block = cfg.get("zero_optimization", {}).get(key)
        if block and block.get("device") == "nvme":
            block["nvme_path"] = a.swap
    budgets = cfg.setdefault("zinf", {}).setdefault("budgets", {})
    budgets.setdefault("device_bytes", "1M")  # below the 1.6 MiB of 16-bit weights: it pages
    budgets.setdefault("pinned_bytes", "8M")  # half the optimizer state: it pages from NVMe

    torch.manual_seed(0)
    net = GPT()
    model = zinf.torch.offload(net, cfg)
    micro = cfg.get("train_micro_batch_size_per_gpu", 1)
    g = torch.Generator().manual_seed(1)
    print(f"{sum(p.numel() for p in net.parameters()) / 1e6:.2f}M parameters, units "
          f"{model.units}")
    step_loss = 0.0
    while model.global_steps < a.steps:
        start = torch.randint(0, 256, (micro, 1), generator=g)
        seq = (start + torch.randint(1, 4, (micro, 1), generator=g) * torch.arange(65)) % 256
        logits = model(seq[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), seq[:, 1:].reshape(-1))
        model.backward(loss)
        step_loss += loss.item()
        if model.step():
            gas = model._cfg.gradient_accumulation_steps
            print(f"step {model.global_steps:3d}  loss {step_loss / gas:.4f}  lr "
                  f"{model.optimizer.param_groups[0]['lr']:.3g}")
            step_loss = 0.0
    s = model.stats()
    print(f"NVMe read {s['bytes']['nvme_read'] / 2**20:.1f} MiB, written "
          f"{s['bytes']['nvme_write'] / 2**20:.1f} MiB; device peak "
          f"{s['peak_bytes']['device'] / 2**20:.1f} MiB of "
          f"{s['budgets']['device_bytes'] / 2**20:.1f}")
    model.close()


if __name__ == "__main__":
    main()
