#!/usr/bin/python3
"""A PyTorch GPT trained through zinf.torch.offload against the same model resident, and
against its bounds.

    /usr/bin/python3 bench/torch_offload_step.py --zinf build/zinf --dir /mnt/nvme/tmp \
        [--layers 8] [--width 256] [--steps 12]

Five models from the same weights, their steps alternating in one process (the order rotated
every step): plain PyTorch with torch.optim.AdamW; plain PyTorch with zinf.optim.CPUAdam (the
same Adam arithmetic as the offloaded runs); zinf.torch.offload with the parameters and Adam
state in pinned host memory; with them on NVMe; and on NVMe with zinf.overlap_adam (each unit's
Adam inside the backward, as soon as its gradients are final). The offloaded runs have a device budget of
half the fp32 parameters, so the device tier pages in every step, and the NVMe run a pinned
budget of 8 bytes a parameter (the gradients and a third of the rest), so the state pages too. A step is forward, backward and
the optimizer step. Each figure is the median of --steps steps after two warm-up steps.

The NVMe bound of an NVMe run is its bytes on the disk a step (zinf's statistics) at the rates
`zinf bench-io` measures on --dir just before (1 MiB requests, queue depth 32); the disk's own
counters (/proc/diskstats) show what reached the device. Its bound is the largest of that, the
compute (plain PyTorch's forward plus backward) and the Adam step (the CPUAdam run's).
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

from diskstats import counters, device_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def disk_rates(zinf, path):
    rates = {}
    for op in ("read", "write"):
        out = subprocess.run([zinf, "bench-io", "--path", path, "--op", op, "--block", "1M",
                              "--qd", "32", "--size", "512M", "--time", "0", "--json"],
                             check=True, capture_output=True, text=True).stdout
        rates[op] = json.loads(out.strip().splitlines()[-1])["gbps"] * 1e9
    return rates


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zinf", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--batch", type=int, default=8)
    a = ap.parse_args()
    zinf_bin = os.path.abspath(a.zinf)
    os.environ.setdefault("ZINF_LIBRARY", os.path.join(os.path.dirname(zinf_bin), "src", "capi",
                                                       "libzinf.so"))
    sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]
    import torch
    import zinf.torch as zt
    from torch_models import GPT, batches, loss_of
    from zinf.optim import CPUAdam

    torch.manual_seed(0)
    net = GPT(vocab=256, c=a.width, heads=4, layers=a.layers, seq=64)
    params = sum(p.numel() for p in net.parameters())
    rates = disk_rates(zinf_bin, a.dir)
    disk = device_of(a.dir)
    runs = {}
    plain = copy.deepcopy(net)
    runs["plain PyTorch, torch.optim.AdamW"] = (plain, torch.optim.AdamW(
        plain.parameters(), lr=1e-3, weight_decay=0.0))
    fused = copy.deepcopy(net)
    runs["plain PyTorch, zinf.optim.CPUAdam"] = (fused, CPUAdam(fused.parameters(), lr=1e-3))
    # Pinned memory: with host homes every byte of state (16 a parameter with the gradient)
    # lives there, plus the slots; with NVMe homes the gradients (4 a parameter) and room for a
    # third of the rest, so the state pages through it in every step.
    for home, pinned, overlap in (("host", 24, False), ("nvme", 8, False), ("nvme", 8, True)):
        cfg = {"zinf": {"swap_dir": tempfile.mkdtemp(dir=a.dir), "overlap_adam": overlap,
                        "budgets": {"device_bytes": params * 2,
                                    "pinned_bytes": params * pinned}}}
        runs[f"zinf.torch.offload, state in {home}" + (", overlap_adam" if overlap else "")] = (
            zt.offload(copy.deepcopy(net), cfg, lr=1e-3, param_home=home, state_home=home,
                       grad_home="host"), None)
    names = list(runs)
    nvme_runs = names[3:]
    data = list(batches(a.steps + 2, 1, b=a.batch, seq=64, vocab=256))
    times = {n: [] for n in names}
    fwdbwd = {n: [] for n in names}
    nvme = {n: [] for n in nvme_runs}
    dsk = {n: [] for n in nvme_runs}
    for i, batch in enumerate(data):
        order = names[i % len(names):] + names[:i % len(names)]
        for n in order:
            model, opt = runs[n]
            if n in nvme_runs:
                s0, d0 = model.stats()["bytes"], counters(disk)
            t0 = time.perf_counter()
            loss_of(model, batch[0]).backward()
            t1 = time.perf_counter()
            if opt is not None:
                opt.step()
                opt.zero_grad()
            else:
                model.step()
            t2 = time.perf_counter()
            if i < 2:
                continue
            times[n].append(t2 - t0)
            fwdbwd[n].append(t1 - t0)
            if n in nvme_runs:
                s1, d1 = model.stats()["bytes"], counters(disk)
                nvme[n].append((s1["nvme_read"] - s0["nvme_read"],
                                s1["nvme_write"] - s0["nvme_write"]))
                dsk[n].append((d1[1] - d0[1], d1[3] - d0[3]))
    med = statistics.median
    base = med(times[names[0]])
    print(f"GPT {a.layers} layers x width {a.width}, batch {a.batch} x 64 tokens: "
          f"{params / 1e6:.2f}M parameters ({params * 4 / 2**20:.1f} MiB fp32), device budget "
          f"{params * 2 / 2**20:.1f} MiB for the offloaded runs; medians of {a.steps} steps")
    print(f"| run | step ms | / {names[0]} | / CPUAdam run |")
    print("| --- | --- | --- | --- |")
    for n in names:
        t = med(times[n])
        print(f"| {n} | {t * 1e3:.1f} | {t / base:.3f} | {t / med(times[names[1]]):.3f} |")
    compute = med(fwdbwd[names[0]])
    adam = med(times[names[1]]) - med(fwdbwd[names[1]])
    print(f"compute bound (plain forward + backward) {compute * 1e3:.1f} ms; Adam bound "
          f"(CPUAdam step) {adam * 1e3:.1f} ms")
    for n in nvme_runs:
        rd, wr = med(b[0] for b in nvme[n]), med(b[1] for b in nvme[n])
        disk_s = rd / rates["read"] + wr / rates["write"]
        bound = max(compute, adam, disk_s)
        print(f"{n}: NVMe bound ({rd / 2**20:.1f} MiB read at {rates['read'] / 1e9:.2f} GB/s, "
              f"{wr / 2**20:.1f} MiB written at {rates['write'] / 1e9:.2f} GB/s) "
              f"{disk_s * 1e3:.1f} ms; step / max(bounds) = {med(times[n]) / bound:.3f}; the "
              f"disk's counters a step {med(b[0] for b in dsk[n]) / 2**20:.1f} MiB read, "
              f"{med(b[1] for b in dsk[n]) / 2**20:.1f} MiB written")
    for n in names[2:]:
        runs[n][0].close()


if __name__ == "__main__":
    main()
