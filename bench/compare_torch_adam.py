#!/usr/bin/python3
"""Side-by-side timing of torch.optim.Adam (foreach=True) and `zinf bench-adam` on the same
number of fp32 elements and threads.

Alternates torch and zinf samples (at least 3 rounds) so that a disturbance on a shared machine
hits both, and prints the medians and the speedup. A torch sample is a fresh process that times
--iters Adam.step() calls on one flat fp32 tensor after two warm-up steps and reports their
median; a zinf sample is one `zinf bench-adam --json` run (itself a median of --iters steps).

torch's foreach Adam allocates full-size temporaries every step (sqrt(v), the denominator, ...).
With glibc's defaults each 256 MiB temporary of a 64M-element step is a fresh mmap, so its page
faults are paid on every step, and on a VM they are expensive. Each round therefore times torch
twice: as installed ("torch") and with glibc told to keep freed memory for reuse
(MALLOC_MMAP_MAX_=0, MALLOC_TRIM_THRESHOLD_ large: "torch_reuse"), the fairer figure for the
arithmetic itself. zinf's fused step has no temporaries. Each round also times
zinf.optim.CPUAdam (python/zinf over the libzinf.so next to --zinf) on the same tensor in a
fresh process, as torch's sample is timed.

Run with Debian's python (it has python3-torch):
  /usr/bin/python3 bench/compare_torch_adam.py [--zinf build/zinf] [--elements 64M]
      [--threads 2] [--rounds 3] [--iters 5] [--json]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

TORCH_SAMPLE = r"""
import json, statistics, sys, time
import torch
n, threads, iters = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
p = torch.nn.Parameter(torch.empty(n).uniform_(-1, 1))
p.grad = torch.empty(n).uniform_(-1e-3, 1e-3)
opt = torch.optim.Adam([p], lr=1e-3, foreach=True)  # weight_decay 0: torch's cheapest path
for _ in range(2):  # warm-up: allocates exp_avg / exp_avg_sq and faults them in
    opt.step()
times = []
for _ in range(iters):
    t0 = time.perf_counter()
    opt.step()
    times.append(time.perf_counter() - t0)
print(json.dumps({"median_s": statistics.median(times), "version": torch.__version__}))
"""

# zinf.optim.CPUAdam (python/zinf over libzinf.so) on the same tensor: what a PyTorch user
# swapping torch's Adam for zinf's gets, Python and ctypes included.
OPTIM_SAMPLE = TORCH_SAMPLE.replace(
    "opt = torch.optim.Adam([p], lr=1e-3, foreach=True)  # weight_decay 0: torch's cheapest path",
    "from zinf.optim import CPUAdam\nopt = CPUAdam([p], lr=1e-3, adamw_mode=False)")

REUSE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(1 << 40)}


def parse_count(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    if t and t[-1] in units:
        return int(t[:-1]) * units[t[-1]]
    return int(t)


def torch_sample(n, threads, iters, reuse):
    env = dict(os.environ, **REUSE_ENV) if reuse else dict(os.environ)
    out = subprocess.run([sys.executable, "-c", TORCH_SAMPLE, str(n), str(threads), str(iters)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def optim_sample(zinf, n, threads, iters):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "python"),
               ZINF_LIBRARY=os.path.join(os.path.dirname(os.path.abspath(zinf)), "src", "capi",
                                         "libzinf.so"))
    out = subprocess.run([sys.executable, "-c", OPTIM_SAMPLE, str(n), str(threads), str(iters)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out)


def zinf_sample(zinf, n, threads, iters):
    cmd = [zinf, "bench-adam", "--elements", str(n), "--threads", str(threads),
           "--iters", str(iters), "--json"]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zinf", default=os.path.join("build", "zinf"), help="zinf binary")
    ap.add_argument("--elements", default="64M", help="elements (K, M, G = 2^10...)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3, help="torch / zinf rounds (>= 3)")
    ap.add_argument("--iters", type=int, default=5, help="steps timed per sample")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    try:
        n = parse_count(args.elements)
    except ValueError:
        print(f"compare_torch_adam.py: --elements '{args.elements}' is not a count",
              file=sys.stderr)
        return 2
    if args.rounds < 3 or args.threads < 1 or args.iters < 1 or n < 1:
        print("compare_torch_adam.py: need --rounds >= 3, --threads >= 1, --iters >= 1",
              file=sys.stderr)
        return 2
    if not os.access(args.zinf, os.X_OK):
        print(f"compare_torch_adam.py: {args.zinf} is not an executable (use --zinf)",
              file=sys.stderr)
        return 2
    probe = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    if probe.returncode != 0:
        print(f"compare_torch_adam.py: {sys.executable} cannot import torch; run with "
              "/usr/bin/python3 (Debian's python3-torch)", file=sys.stderr)
        return 2

    samples = {"torch": [], "torch_reuse": [], "zinf": [], "zinf_optim": []}
    zinf_runs = []
    version = "?"
    for k in range(args.rounds):
        t = torch_sample(n, args.threads, args.iters, reuse=False)
        samples["torch"].append(t["median_s"])
        version = t["version"]
        z = zinf_sample(args.zinf, n, args.threads, args.iters)
        zinf_runs.append(z)
        samples["zinf"].append(z["adam_ms"] / 1e3)
        samples["torch_reuse"].append(
            torch_sample(n, args.threads, args.iters, reuse=True)["median_s"])
        samples["zinf_optim"].append(
            optim_sample(args.zinf, n, args.threads, args.iters)["median_s"])
        print(f"round {k + 1}: torch {samples['torch'][-1] * 1e3:8.1f} ms  "
              f"torch_reuse {samples['torch_reuse'][-1] * 1e3:7.1f} ms  "
              f"zinf.optim.CPUAdam {samples['zinf_optim'][-1] * 1e3:7.2f} ms  "
              f"zinf {samples['zinf'][-1] * 1e3:6.2f} ms ({z['variant']}, {z['adam_gbps']:.1f} "
              f"GB/s, {z['ratio']:.3f} x streaming copy)", file=sys.stderr)

    med = {k: statistics.median(v) for k, v in samples.items()}
    result = {
        "elements": n, "threads": args.threads, "rounds": args.rounds, "iters": args.iters,
        "torch_version": version, "zinf_variant": zinf_runs[0]["variant"],
        "torch_ms": med["torch"] * 1e3, "torch_reuse_ms": med["torch_reuse"] * 1e3,
        "zinf_ms": med["zinf"] * 1e3,
        "zinf_gbps": statistics.median(r["adam_gbps"] for r in zinf_runs),
        "copy_gbps": statistics.median(r["copy_gbps"] for r in zinf_runs),
        "speedup": med["torch"] / med["zinf"],
        "speedup_vs_reuse": med["torch_reuse"] / med["zinf"],
        "zinf_optim_ms": med["zinf_optim"] * 1e3,
        "optim_speedup_vs_reuse": med["torch_reuse"] / med["zinf_optim"],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{n} elements, {args.threads} threads, medians of {args.rounds} rounds "
          f"({args.iters} steps each)")
    print(f"  torch.optim.Adam(foreach=True) {version}          {result['torch_ms']:9.2f} ms")
    print(f"  same, glibc keeping freed memory (torch_reuse) {result['torch_reuse_ms']:9.2f} ms")
    print(f"  zinf {result['zinf_variant']:<12} {result['zinf_gbps']:6.1f} GB/s"
          f"                 {result['zinf_ms']:9.2f} ms  (streaming copy "
          f"{result['copy_gbps']:.1f} GB/s)")
    print(f"  zinf.optim.CPUAdam from Python (ctypes)         {result['zinf_optim_ms']:9.2f} ms")
    print(f"  zinf.optim.CPUAdam {result['optim_speedup_vs_reuse']:.2f}x vs torch_reuse")
    print(f"  speedup {result['speedup']:.2f}x vs torch as installed, "
          f"{result['speedup_vs_reuse']:.2f}x vs torch_reuse")
    return 0


if __name__ == "__main__":
    sys.exit(main())
