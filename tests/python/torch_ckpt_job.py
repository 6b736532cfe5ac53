"""A training job for test_torch_checkpoint.py's kill -9 case: a GPT (tied head, a frozen
embedding of positions, bf16) trained --steps steps with zinf.torch.offload, a checkpoint every
--every steps (the last two kept), each step's loss appended to --losses as a JSON line and
flushed. With --resume it loads the latest checkpoint under --ckpt first. Each step's batch
depends on the step's number only, so a resumed run sees the same data.

    python3 torch_ckpt_job.py --swap DIR --ckpt DIR --losses FILE --steps N [--every K]
        [--resume] [--sleep S]"""
import argparse
import json
import sys
import time

import torch

import zinf.torch as zt
from torch_models import GPT, config, loss_of


def batch_of(step):
    g = torch.Generator().manual_seed(1000 + step)
    start = torch.randint(0, 64, (4, 1), generator=g)
    stride = torch.randint(1, 4, (4, 1), generator=g)
    return (start + stride * torch.arange(33)) % 64


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swap", required=True)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--losses", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--resume", action="store_true")
    ap.add_argument("--sleep", type=float, default=0.0)
    a = ap.parse_args()
    torch.manual_seed(0)
    net = GPT(layers=3, tied=True)
    net.wpe.weight.requires_grad_(False)
    sched = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 40,
                                                 "warmup_max_lr": 3e-3, "warmup_type": "linear"}}
    model = zt.offload(net, config(a.swap, "512K", bf16={"enabled": True}, scheduler=sched,
                                   gradient_clipping=1.0,
                                   optimizer={"type": "AdamW", "params": {"lr": 3e-3}}),
                       param_groups=[{"params": [p for p in net.parameters()
                                                 if p.requires_grad]}])
    if a.resume:
        client = model.load_checkpoint(a.ckpt)
        assert client == {"next_step": model.global_steps}, client
    with open(a.losses, "a") as out:
        while model.global_steps < a.steps:
            step = model.global_steps
            loss = loss_of(model, batch_of(step))
            model.backward(loss)
            model.step()
            out.write(json.dumps({"step": step + 1, "loss": loss.item()}) + "\n")
            out.flush()
            if model.global_steps % a.every == 0:
                model.save_checkpoint(a.ckpt, client_state={"next_step": model.global_steps},
                                      keep=2)
            time.sleep(a.sleep)
    model.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
