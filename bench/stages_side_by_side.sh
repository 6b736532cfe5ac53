#!/bin/bash
# One rank against two ranks with ZeRO stages 0, 1, 2 and 3, the same global batch, alternating
# runs: the "stages side by side" table of docs/benchmarks.md. Usage: bench/stages_side_by_side.sh [ZINF]
# (default build/zinf). Writes summaries (*.json) and logs in a temporary directory it prints.
set -euo pipefail
Z=$(realpath "${1:-build/zinf}")
dir=$(mktemp -d)
cd "$dir"
echo '{"zero_optimization":{"stage":0}}' > s0.json
echo '{"zero_optimization":{"stage":1}}' > s1.json
echo '{"zero_optimization":{"stage":2}}' > s2.json
echo '{"zero_optimization":{"stage":3}}' > s3.json
M="train --layers 8 --width 512 --heads 8 --seq-len 128 --vocab 8192 --batch 4 --steps 6
   --offload nvme --synthetic-bytes 4194304 --device-budget 256M --pinned-budget 1G"
for rep in 1 2; do
  rm -rf sw1 sw2 sw3 sw4 sw5 && mkdir -p sw1 sw2 sw3 sw4 sw5
  $Z $M --config s1.json --grad-accum 2 --swap-dir sw1 --summary-json one_$rep.json > one_$rep.out 2>&1
  $Z launch --nproc 2 -- $Z $M --config s0.json --grad-accum 1 --swap-dir sw2 \
    --summary-json z0_$rep.json > z0_$rep.out 2>&1
  $Z launch --nproc 2 -- $Z $M --config s1.json --grad-accum 1 --swap-dir sw3 \
    --summary-json z1_$rep.json > z1_$rep.out 2>&1
  $Z launch --nproc 2 -- $Z $M --config s2.json --grad-accum 1 --swap-dir sw4 \
    --summary-json z2_$rep.json > z2_$rep.out 2>&1
  $Z launch --nproc 2 -- $Z $M --config s3.json --grad-accum 1 --swap-dir sw5 \
    --summary-json z3_$rep.json > z3_$rep.out 2>&1
done
python3 - <<'PY'
import json
for name in ("one", "z0", "z1", "z2", "z3"):
    for rep in (1, 2):
        d = json.load(open(f"{name}_{rep}.json"))
        print(f"{name} run {rep}: median step {d['step_seconds_median']:.3f} s, optimizer state "
              f"{d['optimizer_state_bytes'] / 2**20:.1f} MiB, gradients "
              f"{d['gradient_bytes'] / 2**20:.1f} MiB, 16-bit weights "
              f"{d['param16_bytes'] / 2**20:.1f} MiB, NVMe read {d['nvme_read_bytes'] / 2**30:.2f} "
              f"written {d['nvme_write_bytes'] / 2**30:.2f} GiB, sent "
              f"{d.get('comm_sent_bytes_per_step', 0) / 2**20:.1f} MiB a step, final loss "
              f"{d['final_loss']:.4f}")
PY
echo "results in $dir"
