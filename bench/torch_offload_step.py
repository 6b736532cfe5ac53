#!/usr/bin/python3
"""A PyTorch GPT trained through zinf.torch.offload (parameters and Adam state on NVMe, a device
budget of half the parameters) against the same model resident, and against its bounds.

    /usr/bin/python3 bench/torch_offload_step.py --zinf build/zinf --dir /mnt/nvme/tmp \
        [--layers 8] [--width 256] [--steps 6]

Resident: plain PyTorch with zinf.optim.CPUAdam (the same Adam arithmetic). Its forward plus
backward time is the compute bound and its optimizer step the Adam bound. The NVMe bound is the
offloaded step's bytes on the disk (from zinf's statistics, per step) at the rates `zinf
bench-io` measures on --dir just before (1 MiB requests, queue depth 32). The disk's own counters
(/proc/diskstats) confirm the bytes. Each figure is the median of --steps steps after two
warm-up steps; the resident and offloaded runs alternate step by step in one process.
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
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--write-behind", choices=["on", "off", "both"], default="on",
                    help="zinf.write_behind for the offloaded model; both: one model each, "
                         "alternating in each step (the order swapped every step)")
    a = ap.parse_args()
    zinf_bin = os.path.abspath(a.zinf)
    os.environ.setdefault("ZINF_LIBRARY", os.path.join(os.path.dirname(zinf_bin), "src", "capi",
                                                       "libzinf.so"))
    sys.path[:0] = [os.path.join(ROOT, "python"), os.path.join(ROOT, "tests", "python")]
    import torch
    import zinf.torch as zt
    from test_torch_offload import GPT, batches, loss_of
    from zinf.optim import CPUAdam

    torch.manual_seed(0)
    net = GPT(vocab=256, c=a.width, heads=4, layers=a.layers, seq=64)
    params = sum(p.numel() for p in net.parameters())
    resident = copy.deepcopy(net)
    variants = {"on": [True], "off": [False], "both": [True, False]}[a.write_behind]
    nets = [copy.deepcopy(net) for _ in variants]
    opt = CPUAdam(resident.parameters(), lr=1e-3)
    rates = disk_rates(zinf_bin, a.dir)
    disk = device_of(a.dir)
    offs = [zt.offload(n, {"zinf": {"swap_dir": tempfile.mkdtemp(dir=a.dir),
                                    "write_behind": wb,
                                    "budgets": {"device_bytes": params * 2,
                                                "pinned_bytes": params * 8}}},
                       lr=1e-3, leases=4, grad_home="host")
            for n, wb in zip(nets, variants)]
    data = list(batches(a.steps + 2, 1, b=8, seq=64, vocab=256))
    t_res, t_fb, t_adam = [], [], []
    t_offs = [[] for _ in offs]
    t_steps = [[] for _ in offs]  # of which zinf's optimizer step (off.step())
    nvme_bytes, disk_bytes = [[] for _ in offs], [[] for _ in offs]
    for i, batch in enumerate(data):
        chunk = batch[0]
        t0 = time.perf_counter()
        loss_of(resident, chunk).backward()
        t1 = time.perf_counter()
        opt.step()
        opt.zero_grad()
        t2 = time.perf_counter()
        order = list(range(len(offs)))
        if i % 2:
            order.reverse()
        for k in order:
            off = offs[k]
            s0 = off.stats()["bytes"]
            d0 = counters(disk)
            t3 = time.perf_counter()
            loss_of(off, chunk).backward()
            t_s = time.perf_counter()
            off.step()
            t4 = time.perf_counter()
            d1 = counters(disk)
            s1 = off.stats()["bytes"]
            if i >= 2:
                t_offs[k].append(t4 - t3)
                t_steps[k].append(t4 - t_s)
                nvme_bytes[k].append((s1["nvme_read"] - s0["nvme_read"],
                                      s1["nvme_write"] - s0["nvme_write"]))
                disk_bytes[k].append((d1[1] - d0[1], d1[3] - d0[3]))
        if i >= 2:
            t_res.append(t2 - t0)
            t_fb.append(t1 - t0)
            t_adam.append(t2 - t1)
    med = statistics.median
    t_off, off = t_offs[0], offs[0]
    rd = med(b[0] for b in nvme_bytes[0])
    wr = med(b[1] for b in nvme_bytes[0])
    nvme_s = rd / rates["read"] + wr / rates["write"]
    compute_s, adam_s = med(t_fb), med(t_adam)
    bound = max(compute_s, adam_s, nvme_s)
    print(f"GPT {a.layers} layers x width {a.width}: {params / 1e6:.2f}M parameters "
          f"({params * 4 / 2**20:.1f} MiB fp32), device budget {params * 2 / 2**20:.1f} MiB; "
          f"medians of {len(t_off)} steps")
    print(f"  resident step (torch + zinf.optim.CPUAdam)  {med(t_res) * 1e3:8.1f} ms")
    for k, wb in enumerate(variants):
        print(f"  offloaded step (zinf.torch.offload, NVMe, write_behind {str(wb).lower():5}) "
              f"{med(t_offs[k]) * 1e3:8.1f} ms ({med(t_offs[k]) / med(t_res):.2f}x resident; "
              f"its optimizer step {med(t_steps[k]) * 1e3:.1f} ms)")
    if len(variants) == 2:
        ratios = [x / y for x, y in zip(t_offs[0], t_offs[1])]
        print(f"  write_behind on / off, median of the paired steps' ratios "
              f"{med(ratios):.3f} (range {min(ratios):.3f}-{max(ratios):.3f})")
    print(f"  compute bound (resident fwd+bwd)            {compute_s * 1e3:8.1f} ms")
    print(f"  Adam bound (resident optimizer step)        {adam_s * 1e3:8.1f} ms")
    print(f"  NVMe bound ({rd / 2**20:.0f} MiB read at {rates['read'] / 1e9:.2f} GB/s, "
          f"{wr / 2**20:.0f} MiB written at {rates['write'] / 1e9:.2f} GB/s) {nvme_s * 1e3:8.1f} ms")
    for k, wb in enumerate(variants):
        print(f"  the disk's counters per step (write_behind {str(wb).lower()}): "
              f"{med(b[0] for b in disk_bytes[k]) / 2**20:.0f} MiB read, "
              f"{med(b[1] for b in disk_bytes[k]) / 2**20:.0f} MiB written; zinf counted "
              f"{med(b[0] for b in nvme_bytes[k]) / 2**20:.0f} / "
              f"{med(b[1] for b in nvme_bytes[k]) / 2**20:.0f} MiB")
    print(f"  offloaded step / max(bounds)                {med(t_off) / bound:8.2f}")
    s = off.stats()
    print(f"  peaks: device {s['peak_bytes']['device_arena'] / 2**20:.1f} MiB, pinned "
          f"{s['peak_bytes']['pinned_pool'] / 2**20:.1f} MiB; stall {s['stall_seconds']:.2f} s, "
          f"prefetch hits {s['prefetch']['hits']} misses {s['prefetch']['misses']}")
    for o in offs:
        o.close()


if __name__ == "__main__":
    main()
