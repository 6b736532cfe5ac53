#!/bin/bash
# Two zinf binaries side by side (e.g. before and after a change), alternating, on docs/benchmarks.md's
# 29.5M model across 2 ranks with its state on NVMe, ZeRO stages 2 and 3, --profile (each bound
# alone: compute, NVMe, Adam, the collectives). Usage:
#   bench/zero3_overlap_side_by_side.sh OLD_ZINF NEW_ZINF [REPS]
# Prints each run's median step and bounds; summaries and logs stay in the directory printed.
set -euo pipefail
OLD=$(realpath "$1")
NEW=$(realpath "$2")
REPS=${3:-2}
dir=$(mktemp -d)
cd "$dir"
echo '{"zero_optimization":{"stage":2}}' > s2.json
echo '{"zero_optimization":{"stage":3}}' > s3.json
M="train --layers 8 --width 512 --heads 8 --seq-len 128 --vocab 8192 --batch 4 --steps 6
   --offload nvme --synthetic-bytes 4194304 --device-budget 256M --pinned-budget 1G --profile"
for rep in $(seq 1 "$REPS"); do
  for stage in 3 2; do
    for which in old new; do
      Z=$OLD; [ "$which" = new ] && Z=$NEW
      rm -rf sw && mkdir -p sw
      $Z launch --nproc 2 -- $Z $M --config s$stage.json --swap-dir sw \
        --summary-json ${which}_z${stage}_$rep.json > ${which}_z${stage}_$rep.out 2>&1
    done
  done
done
python3 - "$REPS" <<'PY'
import json, sys
reps = int(sys.argv[1])
for stage in (2, 3):
    for which in ("old", "new"):
        for rep in range(1, reps + 1):
            d = json.load(open(f"{which}_z{stage}_{rep}.json"))
            print(f"stage {stage} {which} run {rep}: median step {d['step_seconds_median']:.3f} s; "
                  f"alone: compute {d['compute_bound_seconds']:.3f} s, NVMe "
                  f"{d['io_bound_seconds']:.3f} s, Adam {d['adam_bound_seconds']:.3f} s, "
                  f"collectives {d.get('comm_bound_seconds', 0):.3f} s; step / largest "
                  f"{d['step_over_bound']:.2f}; waiting for weights "
                  f"{d['stall_seconds_per_step']:.3f} s a step; gradients {d['grad_seconds_per_step']:.3f} s; "
                  f"final loss {d['final_loss']:.4f}")
PY
echo "results in $dir"
