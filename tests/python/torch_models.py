"""Models and data the zinf.torch tests share (Debian's torch 1.13; any torch >= 1.13).

GPT: a nanoGPT-style decoder (tied embedding and head as nanoGPT has them, or untied);
batches(): learnable sequences; config(): a zinf config with tight budgets; TorchCase: a test
case with a temporary directory; pair_losses(): plain PyTorch and an offloaded model stepped
side by side."""
import math
import tempfile
import unittest

import torch
import torch.nn.functional as F


class Block(torch.nn.Module):
    def __init__(self, c, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(c)
        self.qkv = torch.nn.Linear(c, 3 * c)
        self.proj = torch.nn.Linear(c, c)
        self.ln2 = torch.nn.LayerNorm(c)
        self.fc = torch.nn.Linear(c, 4 * c)
        self.out = torch.nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab=64, c=64, heads=4, layers=4, seq=32, tied=False):
        super().__init__()
        self.wte = torch.nn.Embedding(vocab, c)
        self.wpe = torch.nn.Embedding(seq, c)
        self.blocks = torch.nn.ModuleList(Block(c, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(c)
        self.head = torch.nn.Linear(c, vocab, bias=False)
        if tied:
            self.head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def batches(steps, micro, b=4, seq=32, vocab=64, seed=7):
    """Learnable sequences: each row counts up by a stride from a random start."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        out = []
        for _ in range(micro):
            start = torch.randint(0, vocab, (b, 1), generator=g)
            stride = torch.randint(1, 4, (b, 1), generator=g)
            out.append((start + stride * torch.arange(seq + 1)) % vocab)
        yield out


def loss_of(model, chunk, device="cpu"):
    chunk = chunk.to(device)
    logits = model(chunk[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                           chunk[:, 1:].reshape(-1))


def config(swap_dir, device_bytes, pinned_bytes="8M", **extra):
    c = {"zinf": {"swap_dir": swap_dir,
                  "budgets": {"device_bytes": device_bytes, "pinned_bytes": pinned_bytes}},
         "aio": {"block_size": 65536}}
    c.update(extra)
    return c


def shard_bytes(module, dtype_bytes=4):
    """The largest child's parameter bytes (a unit's shard under the default wrap policy)."""
    sizes = [sum(p.numel() for p in m.parameters()) for m in module.modules()
             if not isinstance(m, torch.nn.ModuleList)]
    return max(sizes[1:]) * dtype_bytes


class TorchCase(unittest.TestCase):
    """A temporary directory (swap() gives each model its own swap directory) and seed 0."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        torch.manual_seed(0)

    def tearDown(self):
        self.dir.cleanup()

    def swap(self):
        return tempfile.mkdtemp(dir=self.dir.name)


def pair_losses(plain, opt, model, data, device="cpu"):
    """One micro-batch a step, plain PyTorch (`opt`) and the offloaded `model` alike: the pairs
    of losses."""
    out = []
    for batch in data:
        lp = loss_of(plain, batch[0], device)
        lp.backward()
        opt.step()
        opt.zero_grad()
        lz = loss_of(model, batch[0], device)
        lz.backward()
        model.step()
        out.append((lp.item(), lz.item()))
    return out
