#!/usr/bin/env bash
# bench/gpu_rows.sh BUILD_DIR OUT_DIR — `zinf plan` against `zinf train` on a lent GPU, one row a
# configuration: the planner's predicted step time and bound beside the measured median step and
# its parts (issue 14's table), for the CUDA backend. Run by bench/gpu_check.sh after its build
# when ZINF_GPU_CHECK_EXTRA=bench/gpu_rows.sh (the build must have the `zinf` target):
#
#   ZINF_GPU_CHECK_TARGETS=zinf ZINF_GPU_CHECK_EXTRA=bench/gpu_rows.sh bash bench/gpu_check.sh
#
# The first configuration also writes a Chrome trace (trace.json) of its steps. Results go to
# OUT_DIR: rows.txt (the table), rows.log (every command's output, then each row's plan and train
# JSON) and trace.json. Rows run in order until ZINF_GPU_ROWS_SECONDS
# (default 240) is spent; a row that would start past it is reported as not run.
set -uo pipefail
build_dir=${1:?build dir}
out_dir=${2:?out dir}
zinf=$build_dir/zinf
log=$out_dir/rows.log
rows=$out_dir/rows.txt
readonly deadline=$((SECONDS + ${ZINF_GPU_ROWS_SECONDS:-240}))
swap=$build_dir/rows-swap
work=$build_dir/rows  # the JSON files stay here (at most 8 files come back from $OUT)
mkdir -p "$out_dir" "$swap" "$work"

# GPT-2 medium's blocks on byte tokens (303M parameters), as bench/gpu_check.sh's (e).
medium="--layers 24 --width 1024 --heads 16 --vocab 256 --seq-len 512 --batch 2 --device-budget 656M --pinned-budget 4G"
# 24 blocks of width 2048 (1.2B parameters): Adam state 14.5 GB in host memory.
wide="--layers 24 --width 2048 --heads 16 --vocab 256 --seq-len 512 --batch 4 --device-budget 4G --pinned-budget 8G"
# The same blocks on 8 x 1024 tokens a step: compute-bound (~30x the tokens of $medium).
long="--layers 24 --width 1024 --heads 16 --vocab 256 --seq-len 1024 --batch 8 --device-budget 8G --pinned-budget 4G"
names=(cpu cpu_overlap cpu_bf16state nvme wide_cpu wide_overlap compute_cpu)
flags=(
  "$medium --offload cpu"
  "$medium --offload cpu --overlap-adam"
  "$medium --offload cpu --optimizer-state-dtype bf16"
  "$medium --offload nvme --swap-dir $swap"
  "$wide --offload cpu"
  "$wide --offload cpu --overlap-adam"
  "$long --offload cpu"
)
steps=(12 12 12 6 6 6 6)

printf '%-14s %9s %9s %6s  %-28s %s\n' row predicted measured ratio "plan bound (compute/adam/nvme)" \
  "measured parts: compute/grad/optimizer(Adam)/stall s, nvme r/w GB per step" >"$rows"
for i in "${!names[@]}"; do
  name=${names[$i]}
  left=$((deadline - SECONDS))
  if ((left < 20)); then
    echo "${name}: not run (time)" >>"$rows"
    continue
  fi
  # shellcheck disable=SC2086
  echo "== $name: zinf plan --device cuda ${flags[$i]}" >>"$log"
  # shellcheck disable=SC2086
  timeout 60 "$zinf" plan --device cuda ${flags[$i]} --json >"$work/$name.plan.json" 2>>"$log"
  trace=()
  ((i == 0)) && trace=(--trace "$out_dir/trace.json")
  echo "== $name: zinf train --device cuda --steps ${steps[$i]} ${flags[$i]}" >>"$log"
  # shellcheck disable=SC2086
  timeout "$((left - 5))" "$zinf" train --device cuda --steps "${steps[$i]}" ${flags[$i]} "${trace[@]}" \
    --summary-json "$work/$name.train.json" >>"$log" 2>&1
  rc=$?
  python3 - "$name" "$work/$name.plan.json" "$work/$name.train.json" "$rc" >>"$rows" <<'PY'
import json, sys
name, plan_path, train_path, rc = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def load(p):
    try:
        with open(p) as f:
            return json.load(f)
    except Exception as e:  # noqa: BLE001 — a missing or cut file is reported in the row
        return {"error": str(e)}
pl, tr = load(plan_path), load(train_path)
if rc != 0 or "error" in tr:
    print(f"{name:<14} train FAILED (rc {rc}; see rows.log)")
    sys.exit(0)
s = pl.get("seconds", {})
pred = s.get("step", float("nan"))
meas = tr["step_seconds_median"]
n = max(1, tr["steps"])
bound = f'{pl.get("bound", "?")} ({s.get("compute", 0):.3f}/{s.get("adam", 0):.3f}/{s.get("nvme", 0):.3f})'
parts = "{:.3f}/{:.3f}/{:.3f}({:.3f})/{:.3f}, {:.2f}/{:.2f}".format(
    tr["compute_seconds_per_step"], tr["grad_seconds_per_step"], tr["optimizer_seconds_per_step"],
    tr.get("adam_seconds_per_step", float("nan")), tr["stall_seconds_per_step"], tr["nvme_read_bytes_step_median"] / 1e9,
    tr["nvme_write_bytes_step_median"] / 1e9)
print(f"{name:<14} {pred:9.4f} {meas:9.4f} {meas / pred if pred else float('nan'):6.2f}  {bound:<28} {parts}")
PY
  for f in "$work/$name.plan.json" "$work/$name.train.json"; do
    echo "== $f" >>"$log"; cat "$f" >>"$log" 2>/dev/null; echo >>"$log"
  done
done
# A trace past what comes back from $OUT (16 MiB a file) is dropped rather than cut.
[ -f "$out_dir/trace.json" ] && [ "$(stat -c %s "$out_dir/trace.json")" -gt 15000000 ] &&
  rm -f "$out_dir/trace.json" && echo "trace.json dropped: over 15 MB" >>"$rows"
cat "$rows"
