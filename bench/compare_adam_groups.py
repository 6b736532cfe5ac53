#!/usr/bin/python3
"""A model's parameter group stepped three ways, side by side: zinf.optim.CPUAdam (one
zinf_adam_step_many call for the whole group), the same optimizer calling zinf_adam_step once
per tensor (how CPUAdam stepped before, and how DeepSpeedCPUAdam steps), and
torch.optim.Adam(foreach=True) (with glibc keeping freed memory, its best setting here).

A framework's model is many tensors, most of them small (biases, norms): the per-tensor call
and thread dispatch cost shows there, not in one large tensor. Each sample is a fresh process
timing --iters steps after two warm-up steps (median); the three alternate for --rounds rounds.

  /usr/bin/python3 bench/compare_adam_groups.py --zinf build/zinf [--model gpt2|small]
      [--threads 2] [--rounds 5] [--iters 9]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

SAMPLE = r"""
import ctypes, json, statistics, sys, time
import torch
kind, model, threads, iters = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
layers, width, vocab = {"gpt2": (12, 768, 50257), "small": (12, 128, 1024)}[model]
shapes = [(vocab, width), (1024, width)]
for _ in range(layers):
    shapes += [(width,), (width,), (width, 3 * width), (3 * width,), (width, width), (width,),
               (width,), (width,), (width, 4 * width), (4 * width,), (4 * width, width), (width,)]
shapes += [(width,), (width,)]
g = torch.Generator().manual_seed(0)
params = []
for s in shapes:
    p = torch.nn.Parameter(torch.empty(s).uniform_(-0.1, 0.1, generator=g))
    p.grad = torch.empty(s).uniform_(-1e-3, 1e-3, generator=g)
    params.append(p)
if kind == "torch":
    opt = torch.optim.Adam(params, lr=1e-3, weight_decay=0.01, foreach=True)
else:
    from zinf import _lib
    from zinf.optim import CPUAdam
    opt = CPUAdam(params, lr=1e-3, weight_decay=0.01, adamw_mode=False)
    if kind == "zinf_per_tensor":
        def step():
            group = opt.param_groups[0]
            h = opt._handle(group)
            for p in group["params"]:
                st = opt.state[p]
                if len(st) == 0:
                    st["step"] = 0
                    st["exp_avg"] = torch.zeros_like(p)
                    st["exp_avg_sq"] = torch.zeros_like(p)
                st["step"] += 1
                _lib.check(_lib.lib.zinf_adam_step(
                    h, st["step"], float(group["lr"]), p.data_ptr(), p.grad.data_ptr(),
                    _lib.DTYPE_F32, st["exp_avg"].data_ptr(), st["exp_avg_sq"].data_ptr(),
                    p.numel(), None, 0))
        opt.step = step
for _ in range(2):
    opt.step()
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
print(json.dumps({"median_s": statistics.median(times), "tensors": len(params),
                  "elements": sum(p.numel() for p in params)}))
"""

REUSE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}
KINDS = ("zinf_many", "zinf_per_tensor", "torch")


def sample(zinf, kind, model, threads, iters):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, **REUSE_ENV)
    env["PYTHONPATH"] = os.path.join(root, "python")
    env["ZINF_LIBRARY"] = os.path.join(os.path.dirname(os.path.abspath(zinf)), "src", "capi",
                                       "libzinf.so")
    out = subprocess.run([sys.executable, "-c", SAMPLE, kind, model, str(threads), str(iters)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zinf", default=os.path.join("build", "zinf"), help="zinf binary")
    ap.add_argument("--model", default="gpt2", choices=["gpt2", "small"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1 or args.threads < 1 or args.iters < 1:
        print("compare_adam_groups.py: need --rounds, --threads, --iters >= 1", file=sys.stderr)
        return 2
    times = {k: [] for k in KINDS}
    info = {}
    for r in range(args.rounds):
        for kind in KINDS:
            s = sample(args.zinf, kind, args.model, args.threads, args.iters)
            times[kind].append(s["median_s"])
            info = s
        print(f"round {r + 1}: " + "  ".join(f"{k} {times[k][-1] * 1e3:.2f} ms" for k in KINDS),
              file=sys.stderr)
    med = {k: statistics.median(v) for k, v in times.items()}
    paired = [a / b for a, b in zip(times["zinf_per_tensor"], times["zinf_many"])]
    result = {"model": args.model, "tensors": info["tensors"], "elements": info["elements"],
              "threads": args.threads, "rounds": args.rounds,
              **{f"{k}_ms": med[k] * 1e3 for k in KINDS},
              "per_tensor_over_many": statistics.median(paired),
              "torch_over_many": med["torch"] / med["zinf_many"]}
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{args.model}: {info['tensors']} tensors, {info['elements']} elements, "
          f"{args.threads} threads, medians of {args.rounds} rounds of {args.iters} steps")
    for k in KINDS:
        print(f"  {k:<16} {med[k] * 1e3:9.2f} ms")
    print(f"  per tensor / many {result['per_tensor_over_many']:.2f} (median of paired rounds), "
          f"torch / many {result['torch_over_many']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
