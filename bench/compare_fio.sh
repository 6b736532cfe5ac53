#!/usr/bin/env bash
# bench/compare_fio.sh — zinf bench-io against fio, side by side on the same file, each run
# checked against the disk's own counters.
#
# The file is filled once with a real write pass (`zinf bench-io --op write --time 0 --keep`),
# so both tools read data that is on the disk, not holes or unwritten extents (those read as
# zeros at memory speed: a number the disk never saw). zinf's runs use --no-fill, which keeps
# the file as it is and refuses it unless it is all written data; fio gets --fallocate=none.
# For each configuration (engine io_uring and libaio; sequential read and write; 1 MiB blocks;
# queue depth 8 and 32; O_DIRECT), fio and `zinf bench-io` run alternately (A B A B ..., PAIRS
# pairs, the order flipped every pair). Around every run the sectors read and written of the
# file's block device are sampled from /proc/diskstats, and the run's line shows the tool's own
# GB/s beside the GB/s the device counted over the tool's run time ("disk"). The counters
# include any other I/O on that device meanwhile; a run whose bytes the device did not see
# (counted < 90% of the tool's) is flagged NOT SEEN BY THE DISK. Last, each side's median GB/s,
# the median of the per-pair ratios zinf/fio, and the median disk/tool byte ratio of each side.
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
rm -f "$file"
# Create and fill the shared file once: a full sequential write pass puts every byte on the disk.
"$zinf" bench-io --path "$dir" --size "$size" --op write --time 0 --block 1M --qd 16 --keep \
  --json >/dev/null

# The block device holding the file, as /proc/diskstats names it (a partition has its own line).
read -r dev_major dev_minor < <(stat -c '%Hd %Ld' "$file")
dev_name=$(awk -v M="$dev_major" -v m="$dev_minor" '$1 == M && $2 == m {print $3}' /proc/diskstats)
if [ -z "$dev_name" ]; then
  echo "warning: device $dev_major:$dev_minor of $file is not in /proc/diskstats;" \
    "disk counts will read 0" >&2
fi
echo "file: $file ($size), device: ${dev_name:-?} ($dev_major:$dev_minor)"

diskstats() {  # prints "sectors_read sectors_written" of the file's device
  awk -v M="$dev_major" -v m="$dev_minor" '$1 == M && $2 == m {print $6, $10; f = 1}
    END {if (!f) print 0, 0}' /proc/diskstats
}

# One run of one tool, with the device's sectors sampled around it. Prints a line to stderr
# and "tool_gbps disk_bytes/tool_bytes" to stdout; a failing tool ends the script (set -e).
measured() {  # tool engine op qd
  local tool=$1 engine=$2 op=$3 qd=$4 before after json
  before=$(diskstats)
  if [ "$tool" = fio ]; then
    local ioengine=$engine extra=()
    [ "$engine" = uring ] && ioengine=io_uring && extra=(--fixedbufs=1 --registerfiles=1)
    [ "$engine" = aio ] && ioengine=libaio
    json=$(fio --name=cmp --filename="$file" --rw="$op" --bs="$block" --iodepth="$qd" --direct=1 \
      --ioengine="$ioengine" "${extra[@]}" --size="$size" --fallocate=none --runtime="$secs" \
      --time_based=1 --output-format=json 2>/dev/null)
  else
    json=$("$zinf" bench-io --path "$dir" --size "$size" --engine "$engine" --op "$op" \
      --block "$block" --qd "$qd" --time "$secs" --no-fill --json)
  fi
  after=$(diskstats)
  $py - "$tool" "$engine" "$op" "$qd" "$before" "$after" "$json" <<'PY'
import json, sys
tool, engine, op, qd, before, after, text = sys.argv[1:8]
j = json.loads(text)
if tool == "fio":
    job = j["jobs"][0][op]
    nbytes, seconds = job["io_bytes"], job["runtime"] / 1000.0
else:
    nbytes, seconds = j["bytes"], j["seconds"]
gbps = nbytes / seconds / 1e9
field = 0 if op in ("read", "randread") else 1
sectors = int(after.split()[field]) - int(before.split()[field])
disk = sectors * 512
seen = disk / nbytes if nbytes else 0.0
flag = "" if seen >= 0.9 else "   NOT SEEN BY THE DISK"
print(f"  {tool:<4} {engine:<5} {op:<5} qd {qd:>3}: {gbps:7.3f} GB/s   disk {disk / seconds / 1e9:7.3f} GB/s"
      f"  ({disk / 1e9:.2f} of {nbytes / 1e9:.2f} GB counted){flag}", file=sys.stderr)
print(gbps, seen)
PY
}

result=$(mktemp)
trap 'rm -f "$result"' EXIT
summary=()
for engine in $engines; do
  for op in $ops; do
    for qd in $qds; do
      f=(); z=(); fs=(); zs=()
      for ((i = 0; i < pairs; i++)); do
        if ((i % 2 == 0)); then order="fio zinf"; else order="zinf fio"; fi
        for tool in $order; do
          measured "$tool" "$engine" "$op" "$qd" >"$result"
          read -r g s <"$result"
          if [ "$tool" = fio ]; then f+=("$g"); fs+=("$s"); else z+=("$g"); zs+=("$s"); fi
        done
      done
      summary+=("$($py - "$engine" "$op" "$block" "$qd" "${f[*]}" "${z[*]}" "${fs[*]}" "${zs[*]}" <<'PY'
import statistics, sys
engine, op, block, qd, f, z, fs, zs = sys.argv[1:9]
f = [float(x) for x in f.split()]; z = [float(x) for x in z.split()]
fs = [float(x) for x in fs.split()]; zs = [float(x) for x in zs.split()]
ratios = [b / a for a, b in zip(f, z)]
print(f"{engine:<6} {op:<6} {block:<6} {qd:>3} {statistics.median(f):10.3f} "
      f"{statistics.median(z):10.3f} {statistics.median(ratios):9.3f} "
      f"{statistics.median(fs):9.2f} {statistics.median(zs):9.2f}   "
      f"ratios {' '.join(f'{r:.2f}' for r in ratios)}")
PY
)")
    done
  done
done
printf "%-6s %-6s %-6s %3s %10s %10s %9s %9s %9s   %s\n" engine op block qd "fio GB/s" \
  "zinf GB/s" "zinf/fio" "fio disk" "zinf disk" \
  "(medians of $pairs pairs, runs of ${secs}s; disk = bytes the device counted / bytes the tool reported)"
printf "%s\n" "${summary[@]}"
rm -f "$file"
