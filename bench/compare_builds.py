#!/usr/bin/python3
"""Two zinf builds side by side on one command: alternating runs (the order flips every round,
so a drifting disk treats both alike), each run's figure from its last JSON line, and the disk's
own counters (/proc/diskstats: requests and bytes read and written) for every run.

    bench/compare_builds.py --a /tmp/zinf-before --b build/zinf --key gbps --rounds 6 -- \\
        bench-io --path /tmp/f.dat --op read --block 1M --qd 32 --time 0 --json

--disk names the block device to count (default: the one holding the current directory).
Prints each run, the medians of --key and their ratio b / a.
"""
import argparse
import json
import os
import statistics
import subprocess

from diskstats import counters, device_of


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="the first zinf binary")
    ap.add_argument("--b", required=True, help="the second zinf binary")
    ap.add_argument("--key", required=True, help="the JSON field compared (e.g. gbps)")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--disk", default=None)
    ap.add_argument("--json-file", default=None,
                    help="read the figure from this file (e.g. train's --summary-json) "
                         "instead of the last line of stdout")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="-- the zinf arguments")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    disk = a.disk or device_of(".")
    bins = {"a": a.a, "b": a.b}
    res = {"a": [], "b": []}
    for r in range(a.rounds):
        for side in (["a", "b"] if r % 2 == 0 else ["b", "a"]):
            c0 = counters(disk)
            out = subprocess.run([bins[side]] + args, capture_output=True, text=True)
            c1 = counters(disk)
            if out.returncode != 0:
                raise SystemExit(f"compare_builds: {bins[side]} exited {out.returncode}: "
                                 f"{out.stderr.strip()[-500:]}")
            if a.json_file:
                with open(a.json_file) as f:
                    j = json.loads(f.read().strip().splitlines()[-1])
                os.remove(a.json_file)
            else:
                j = json.loads(out.stdout.strip().splitlines()[-1])
            res[side].append(float(j[a.key]))
            d = [y - x for x, y in zip(c0, c1)]
            print(f"round {r} {side}: {a.key} {j[a.key]:.4g}  {disk}: read {d[0]} requests "
                  f"{d[1] / 2**30:.2f} GiB, write {d[2]} requests {d[3] / 2**30:.2f} GiB",
                  flush=True)
    ma, mb = statistics.median(res["a"]), statistics.median(res["b"])
    print(f"median {a.key}: a {ma:.4g}, b {mb:.4g}, b/a {mb / ma:.3f} ({a.rounds} rounds each)")


if __name__ == "__main__":
    main()
