#!/usr/bin/python3
"""Runs torch.optim.Adam and/or AdamW over inputs written by cpu_adam_torch_test and writes
the results back, as raw little-endian float32 files in DIR:

  in:  param0.f32 (n), grads.f32 (steps * n)
  out: for each MODE:WEIGHT_DECAY given, MODE_param.f32, MODE_exp_avg.f32, MODE_exp_avg_sq.f32

usage: torch_adam_ref.py DIR N STEPS LR BETA1 BETA2 EPS MODE:WEIGHT_DECAY...   (MODE adam|adamw)
Exit status 77 when torch (or numpy) cannot be imported, so the test can skip.
"""
import os
import sys


def main():
    try:
        import numpy as np
        import torch
    except ImportError as e:  # the test turns this into a skip
        print(f"torch_adam_ref.py: {e}", file=sys.stderr)
        return 77
    if len(sys.argv) < 9:
        print(__doc__, file=sys.stderr)
        return 2
    d, n, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    lr, beta1, beta2, eps = (float(x) for x in sys.argv[4:8])
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    p0 = np.fromfile(os.path.join(d, "param0.f32"), dtype="<f4", count=n)
    grads = np.fromfile(os.path.join(d, "grads.f32"), dtype="<f4", count=steps * n)
    if p0.size != n or grads.size != steps * n:
        print("torch_adam_ref.py: input files are short", file=sys.stderr)
        return 1
    for spec in sys.argv[8:]:
        mode, wd = spec.split(":")
        cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[mode]
        p = torch.nn.Parameter(torch.from_numpy(p0.copy()))
        opt = cls([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=float(wd),
                  foreach=False)
        for k in range(steps):
            p.grad = torch.from_numpy(grads[k * n:(k + 1) * n].copy())
            opt.step()
        state = opt.state[p]
        out = {"param": p.detach(), "exp_avg": state["exp_avg"], "exp_avg_sq": state["exp_avg_sq"]}
        for name, t in out.items():
            t.numpy().astype("<f4").tofile(os.path.join(d, f"{mode}_{name}.f32"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
