#!/usr/bin/python3
"""zinf.AioHandle (python/zinf, ctypes over libzinf.so) against `zinf bench-io` on the same disk
with the same settings (block size, queue depth, O_DIRECT, engine), alternating, so that the
Python layer's cost shows as a ratio (issue 13 asks >= 0.95).

    /usr/bin/python3 bench/compare_aio.py --zinf build/zinf --dir /mnt/nvme/tmp \
        [--size 1G] [--block 1M] [--qd 32] [--rounds 5] [--chunk 256M]

Reads: one file written once (so both read the same extents, with the same history), read
whole by `zinf bench-io --path FILE --op read --time 0` and by AioHandle.async_pread into
--chunk-sized locked tensors (each call split by the engine into --block pieces, --qd in
flight, as DeepSpeed's aio_handle does), all queued, then one wait() (--size bytes of locked
memory). Writes: each side writes a fresh
file preallocated with fallocate (bench-io's swap file is; so is this one). Every run's bytes
are confirmed by the block device's own counters (/proc/diskstats sectors): a run whose device
bytes fall short of its logical bytes is flagged (data served from a cache, not the disk).
Prints each run and the medians with their ratio (AioHandle / bench-io).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from diskstats import counters, device_of


def parse_size(s):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--zinf", required=True, help="the zinf binary (its libzinf.so is found "
                    "next to it in src/capi/ unless ZINF_LIBRARY is set)")
    ap.add_argument("--dir", required=True, help="a directory on the disk to measure")
    ap.add_argument("--size", default="1G")
    ap.add_argument("--block", default="1M")
    ap.add_argument("--qd", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk", default="256M", help="bytes per AioHandle call")
    ap.add_argument("--engine", default="uring")
    a = ap.parse_args()
    zinf_bin = os.path.abspath(a.zinf)
    if "ZINF_LIBRARY" not in os.environ:
        os.environ["ZINF_LIBRARY"] = os.path.join(os.path.dirname(zinf_bin), "src", "capi",
                                                  "libzinf.so")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import torch  # noqa: E402
    import zinf  # noqa: E402

    size, block, chunk = parse_size(a.size), parse_size(a.block), parse_size(a.chunk)
    chunk = min(chunk, size)
    if size % chunk:
        sys.exit("compare_aio: --size must be a multiple of --chunk")
    disk = device_of(a.dir)
    h = zinf.AioHandle(block_size=block, queue_depth=a.qd, engine=a.engine)
    # One locked tensor per chunk: every transfer of a pass is queued before the one wait, so
    # the engine streams the whole file as bench-io does (no drain between calls).
    bufs = [h.new_cpu_locked_tensor(chunk, torch.empty(0, dtype=torch.uint8))
            for _ in range(size // chunk)]
    for buf in bufs:
        buf.copy_(torch.randint(0, 256, (chunk,), dtype=torch.uint8))
    read_file = os.path.join(a.dir, "compare_aio_read.dat")
    write_file = os.path.join(a.dir, "compare_aio_write.dat")

    def fresh(path):
        if os.path.exists(path):
            os.remove(path)
        fd = os.open(path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.posix_fallocate(fd, 0, size)
        os.close(fd)

    # The read file: written once, fully, by AioHandle, then synced.
    fresh(read_file)
    for i, off in enumerate(range(0, size, chunk)):
        h.async_pwrite(bufs[i], read_file, off)
    h.wait()
    os.sync()

    def timed(fn):
        rq0, r0, wq0, w0 = counters(disk)
        t0 = time.perf_counter()
        fn()
        secs = time.perf_counter() - t0
        rq1, r1, wq1, w1 = counters(disk)
        timed.requests = (rq1 - rq0, wq1 - wq0)
        return secs, r1 - r0, w1 - w0

    def aio_read():
        for i, off in enumerate(range(0, size, chunk)):
            h.async_pread(bufs[i], read_file, off)
        h.wait()

    def aio_write():
        for i, off in enumerate(range(0, size, chunk)):
            h.async_pwrite(bufs[i], write_file, off)
        h.wait()

    def bench_io(op, path):
        out = subprocess.run([zinf_bin, "bench-io", "--path", path, "--op", op, "--block",
                              a.block, "--qd", str(a.qd), "--size", a.size, "--time", "0",
                              "--engine", a.engine, "--json"],
                             check=True, capture_output=True, text=True).stdout
        return json.loads(out.strip().splitlines()[-1])["gbps"]

    results = {k: [] for k in ("read_aio", "read_bench", "write_aio", "write_bench")}
    print(f"compare_aio: {a.size} file on {disk}, block {a.block}, qd {a.qd}, engine {a.engine},"
          f" AioHandle calls of {a.chunk}; GB/s (device bytes / logical bytes)")
    for r in range(a.rounds):
        order = ["aio", "bench"] if r % 2 == 0 else ["bench", "aio"]
        for op in ("read", "write"):
            for side in order:
                if side == "aio":
                    if op == "write":
                        fresh(write_file)
                        os.sync()
                    secs, rd, wr = timed(aio_read if op == "read" else aio_write)
                    gbps = size / secs / 1e9  # wall time of the calls, waits included
                else:
                    if op == "write":
                        # bench-io makes its own preallocated file in the directory.
                        secs, rd, wr = timed(lambda: results.__setitem__(
                            "_g", bench_io("write", a.dir)))
                    else:
                        secs, rd, wr = timed(lambda: results.__setitem__(
                            "_g", bench_io("read", read_file)))
                    gbps = results.pop("_g")  # bench-io's own timing of its transfers
                dev = rd if op == "read" else wr
                flag = "" if dev >= 0.98 * size else "  (device bytes short: cached?)"
                results[f"{op}_{side}"].append(gbps)
                reqs = timed.requests[0 if op == "read" else 1]
                print(f"  round {r} {op:5} {side:5} {gbps:7.3f} GB/s  device "
                      f"{dev / size:5.2f}x in {reqs} requests{flag}", flush=True)
    for op in ("read", "write"):
        ma, mb = statistics.median(results[f"{op}_aio"]), statistics.median(results[f"{op}_bench"])
        print(f"{op}: AioHandle {ma:.3f} GB/s, bench-io {mb:.3f} GB/s, ratio {ma / mb:.3f} "
              f"(medians of {a.rounds})")
    os.remove(read_file)
    if os.path.exists(write_file):
        os.remove(write_file)


if __name__ == "__main__":
    main()
