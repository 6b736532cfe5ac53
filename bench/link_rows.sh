#!/bin/bash
# `zinf plan`'s link model against measured steps on the host-emulated device, its link paced by
# --h2d-gbps (each row: zinf plan with the row's flags, which measures compute and Adam itself,
# then zinf train with the same flags; across ranks the plan also gets --comm-gbps, zinf
# bench-comm's rate on this machine). Usage:
#   bench/link_rows.sh [ZINF] [STEPS]
# Prints one table row per configuration: the plan's bound, predicted and measured median step,
# the error, and the link bytes a step (plan / run).
set -euo pipefail
Z=$(realpath "${1:-build/zinf}")
STEPS=${2:-10}
dir=$(mktemp -d)
cd "$dir"
echo '{"zero_optimization":{"stage":3}}' > z3.json
M="--layers 4 --width 256 --heads 4 --seq-len 64 --batch 4 --pinned-budget 64M"
rows=(
  "link|$M --offload cpu --device-budget 64M --h2d-gbps 0.05"
  "link, refetch|$M --offload cpu --device-budget 22M --h2d-gbps 0.05"
  "link, refetch, 2 micro-batches|$M --offload cpu --device-budget 22M --h2d-gbps 0.05 --grad-accum 2"
  "compute and link|${M/--batch 4/--batch 16} --offload cpu --device-budget 96M --h2d-gbps 0.05"
  "state on NVMe|$M --offload nvme --swap-dir sw --device-budget 22M --h2d-gbps 0.05"
  "ZeRO-3, 2 ranks|$M --offload cpu --device-budget 32M --h2d-gbps 0.1 --config z3.json|--comm-gbps 1.1"
)
for row in "${rows[@]}"; do
  IFS='|' read -r name flags plan_only <<< "$row"
  world=1
  [[ $flags == *z3.json* ]] && world=2
  rm -rf sw
  $Z plan $flags $plan_only --world $world --json > plan.json 2> plan.err
  if [ $world = 1 ]; then
    $Z train $flags --steps "$STEPS" --summary-json run.json > run.out 2>&1
  else
    $Z launch --nproc 2 -- $Z train $flags --steps "$STEPS" --summary-json run.json > run.out 2>&1
  fi
  python3 - "$name" "$flags" <<'PY'
import json, sys
p = json.load(open("plan.json")); r = json.load(open("run.json"))
pred, meas = p["seconds"]["step"], r["step_seconds_median"]
print(f"| `{sys.argv[2]}` | {sys.argv[1]}: {p['bound']} | {pred:.3f} s | {meas:.3f} s | "
      f"{100 * (pred - meas) / meas:+.0f}% | {p['h2d_bytes_per_step'] / 2**20:.1f} / "
      f"{r['h2d_bytes_step_median'] / 2**20:.1f} MiB up, {p['d2h_bytes_per_step'] / 2**20:.1f} / "
      f"{r['d2h_bytes_step_median'] / 2**20:.1f} MiB down |")
PY
done
echo "(runs under $dir)"
