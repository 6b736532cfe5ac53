#!/usr/bin/env bash
# bench/compare_fio.sh — zinf bench-io against fio, side by side on the same file.
#
# For each configuration (engine io_uring and libaio; sequential read and write; 1 MiB blocks;
# queue depth 8 and 32; O_DIRECT), runs fio and `zinf bench-io` alternately (A B A B ..., PAIRS
# pairs, the order flipped every pair) on one file, and prints each side's median GB/s and the
# median of the per-pair ratios zinf/fio. Pairing and medians are what make a noisy disk fair.
#
# usage: bench/compare_fio.sh [DIR]   (default build/compare-fio)
# env:   PAIRS (9), SECONDS_PER_RUN (3), SIZE (1G), ZINF (build/zinf), ENGINES ("uring aio"),
#        OPS ("read write"), QDS ("8 32"), BLOCK (1M)
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir=${1:-$root/build/compare-fio}
pairs=${PAIRS:-9}
secs=${SECONDS_PER_RUN:-3}
size=${SIZE:-1G}
zinf=${ZINF:-$root/build/zinf}
engines=${ENGINES:-"uring aio"}
ops=${OPS:-"read write"}
qds=${QDS:-"8 32"}
block=${BLOCK:-1M}
py=/usr/bin/python3

command -v fio >/dev/null || { echo "fio is not installed (tools/dev.sh setup installs it)" >&2; exit 1; }
[ -x "$zinf" ] || { echo "no zinf binary at $zinf (build first: tools/dev.sh build)" >&2; exit 1; }
mkdir -p "$dir"
file="$dir/zinf-bench-io.dat"
# Create and fill the shared file once (zinf preallocates it; a full write pass gives real blocks).
"$zinf" bench-io --path "$dir" --size "$size" --op write --time 0 --block 1M --qd 16 --keep \
  --json >/dev/null 2>&1

fio_gbps() {  # engine op qd
  local ioengine=$1 extra=()
  [ "$ioengine" = uring ] && ioengine=io_uring && extra=(--fixedbufs=1 --registerfiles=1)
  [ "$ioengine" = aio ] && ioengine=libaio
  fio --name=cmp --filename="$file" --rw="$2" --bs="$block" --iodepth="$3" --direct=1 \
    --ioengine="$ioengine" "${extra[@]}" --size="$size" --runtime="$secs" --time_based=1 \
    --output-format=json 2>/dev/null |
    $py -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; op=sys.argv[1];
print(j[op]["bw_bytes"]/1e9)' "$2"
}

zinf_gbps() {  # engine op qd
  "$zinf" bench-io --path "$dir" --size "$size" --engine "$1" --op "$2" --block "$block" \
    --qd "$3" --time "$secs" --keep --no-fill --json 2>/dev/null |
    $py -c 'import json,sys; print(json.loads(sys.stdin.readline())["gbps"])'
}

printf "%-6s %-6s %-6s %3s %10s %10s %12s   %s\n" engine op block qd "fio GB/s" "zinf GB/s" \
  "zinf/fio" "(median of $pairs paired ratios; runs of ${secs}s)"
for engine in $engines; do
  for op in $ops; do
    for qd in $qds; do
      f=(); z=()
      for ((i = 0; i < pairs; i++)); do
        if ((i % 2 == 0)); then
          f+=("$(fio_gbps "$engine" "$op" "$qd")"); z+=("$(zinf_gbps "$engine" "$op" "$qd")")
        else
          z+=("$(zinf_gbps "$engine" "$op" "$qd")"); f+=("$(fio_gbps "$engine" "$op" "$qd")")
        fi
      done
      $py - "$engine" "$op" "$block" "$qd" "${f[*]}" "${z[*]}" <<'PY'
import statistics, sys
engine, op, block, qd, f, z = sys.argv[1:7]
f = [float(x) for x in f.split()]; z = [float(x) for x in z.split()]
ratios = [b / a for a, b in zip(f, z)]
print(f"{engine:<6} {op:<6} {block:<6} {qd:>3} {statistics.median(f):10.3f} "
      f"{statistics.median(z):10.3f} {statistics.median(ratios):12.3f}   "
      f"ratios {' '.join(f'{r:.2f}' for r in ratios)}")
PY
    done
  done
done
rm -f "$file"
