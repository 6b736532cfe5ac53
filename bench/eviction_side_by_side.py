#!/usr/bin/python3
"""Eviction policies side by side on one `zinf train` job: alternating runs (the order flips
every round, so a drifting disk treats each policy alike), each run's NVMe bytes a step and
step time (medians, from --summary-json), and the disk's own counters (/proc/diskstats) per run.

    bench/eviction_side_by_side.py --zinf build/zinf --policies belady,cost --rounds 3 -- \\
        --steps 40 --vocab 11520

Each run gets a config file holding only {"bf16": {"enabled": true}, "zinf":
{"eviction_policy": P}} (the job's other values are zinf train's defaults and the flags after
`--`) and its own swap directory under --dir. Prints each run, then per policy the medians and
their ratios to the first policy.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

from diskstats import counters, device_of


def run(zinf, policy, flags, work, disk):
    cfg = os.path.join(work, f"{policy}.json")
    with open(cfg, "w") as f:
        json.dump({"bf16": {"enabled": True}, "zinf": {"eviction_policy": policy}}, f)
    summary = os.path.join(work, f"{policy}.summary.json")
    swap = os.path.join(work, f"swap-{policy}")
    before = counters(disk)
    subprocess.run([zinf, "--log-level", "warn", "train", "--config", cfg, "--swap-dir", swap,
                    "--summary-json", summary] + flags,
                   check=True, stdout=subprocess.DEVNULL)
    after = counters(disk)
    with open(summary) as f:
        s = json.load(f)
    return {"step": s["step_seconds_median"],
            "nvme_read": s["nvme_read_bytes_step_median"],
            "nvme_write": s["nvme_write_bytes_step_median"],
            "evictions": s["device_evictions"] + s["host_evictions"],
            "final_loss": s["final_loss"],
            "disk_read": after[1] - before[1],
            "disk_write": after[3] - before[3]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zinf", default="build/zinf")
    ap.add_argument("--policies", default="belady,cost")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the swap files go (default: a temp dir here)")
    ap.add_argument("flags", nargs=argparse.REMAINDER, help="-- then zinf train's flags")
    a = ap.parse_args()
    flags = a.flags[1:] if a.flags[:1] == ["--"] else a.flags
    policies = a.policies.split(",")
    work = a.dir or tempfile.mkdtemp(prefix="evict-", dir=".")
    disk = device_of(work)
    runs = {p: [] for p in policies}
    for r in range(a.rounds):
        order = policies if r % 2 == 0 else list(reversed(policies))
        for p in order:
            x = run(a.zinf, p, flags, work, disk)
            runs[p].append(x)
            print(f"round {r} {p:>7}: step {x['step']:.3f} s, NVMe a step read "
                  f"{x['nvme_read'] / 2**20:.1f} MiB written {x['nvme_write'] / 2**20:.1f} MiB, "
                  f"evictions {x['evictions']}, final loss {x['final_loss']:.4f}; disk counted "
                  f"{x['disk_read'] / 2**20:.0f} MiB read {x['disk_write'] / 2**20:.0f} MiB written",
                  flush=True)
    base = policies[0]
    med = {p: {k: statistics.median(x[k] for x in runs[p]) for k in ("step", "nvme_read",
                                                                     "nvme_write", "evictions")}
           for p in policies}
    print("policy   step_s  read_MiB/step  write_MiB/step  evictions  step/base  read/base")
    for p in policies:
        m = med[p]
        print(f"{p:<7} {m['step']:7.3f} {m['nvme_read'] / 2**20:14.1f} {m['nvme_write'] / 2**20:15.1f}"
              f" {m['evictions']:10.0f} {m['step'] / med[base]['step']:10.3f}"
              f" {m['nvme_read'] / max(1, med[base]['nvme_read']):10.3f}")


if __name__ == "__main__":
    main()
