#!/usr/bin/env bash
# bench/gpu_check.sh — the one check to run on a lent GPU machine (an H200: sm_90). From the
# repository root:
#
#   bash bench/gpu_check.sh
#
# It (a) unpacks the carried Debian packages in .debs/ (fetched here by bench/gpu_debs.sh) into
# /tmp/sysroot unless the caller has already done so (../shared/device/README.md), pointing
# CMake and pkg-config at them, (b) configures with CUDA for sm_90 into
# build-gpu and builds with every core, (c) runs the gpu-labelled tests, (d) measures pinned
# copy bandwidth and the MatmulForward rate (bench/gpu_bandwidth.cu), (e) runs a short
# training on the GPU (`zinf train --device cuda`) with a device budget below the model's bf16
# size (computed below for the CUDA backend), (f) runs the Python package's tests under the
# machine's python3 and torch with ZINF_TEST_DEVICE=cuda (zinf.torch.offload on CUDA tensors
# against plain PyTorch on the GPU), (g) `zinf plan` with (e)'s flags on the GPU (its predicted
# step time and bound beside (e)'s measured median), (h) a short `zinf train --device cuda` of
# the default job (weights, gradients and Adam state on NVMe), and prints a summary table LAST. Each part has its
# own timeout inside an overall deadline (ZINF_GPU_CHECK_SECONDS, default 345 s), so the whole
# run stays under 6 minutes; a part killed by its timeout is reported as TIMED OUT with the last
# stage that completed, and a watchdog stops the script 60 s past the deadline. A part that
# cannot run (no GPU, a build failure) is reported in the table; the table is printed whatever
# happens (an EXIT trap). ZINF_DEVICE_RULES=abort: a broken device rule (a CUDA call from a
# stream callback, a free of memory in use) stops with its message instead of hanging.
#
# Results and logs go to $OUT when it is set (the device tool's folder; at most 8 files come
# back), else to build-gpu/gpu-check: setup.log, ctest.log, bandwidth.json, train.log,
# train.json, python.log, nvme.log, summary.txt.
#
# Environment knobs (all optional):
#   ZINF_GPU_CHECK_BUILD_DIR   build folder (default build-gpu)
#   ZINF_GPU_CHECK_TARGETS     space-separated targets to build (default: all)
#   ZINF_GPU_CHECK_JOBS        build jobs (default: every core)
#   ZINF_GPU_CHECK_SECONDS     overall deadline in seconds (default 345)
#   ZINF_GPU_CHECK_TRAIN_FLAGS model and budget flags for `zinf train` (default below; not
#                              --device, --steps or --summary-json, which the script sets)
#   ZINF_GPU_CHECK_STEPS       training steps (default 20)
#   ZINF_GPU_CHECK_SYSROOT     where .debs are unpacked (default /tmp/sysroot)
#   ZINF_GPU_CHECK_EXTRA       a script to run on the build instead of parts (c)-(h), e.g.
#                              bench/gpu_rows.sh (plan against train, one row a configuration)
#
# Rehearsal without a GPU (do it before spending device time): `ZINF_GPU_CHECK_SYSROOT=/tmp/sr
# ZINF_GPU_CHECK_SECONDS=3000 bash bench/gpu_check.sh` configures, builds and links against the
# unpacked packages only (CMAKE_PREFIX_PATH and pkg-config point there first), runs the gpu tests
# (they skip) and reports the GPU parts as not run.
#
# The run on a lent machine (one `run` call, carry [".debs"]):
#   ZINF_GPU_CHECK_SECONDS=400 ZINF_GPU_CHECK_TARGETS="zinf zinf_shared gpu_bandwidth
#   cuda_probe_test cuda_device_test cuda_layer_ops_test cuda_backend_test" bash bench/gpu_check.sh
#
# Exit status: 0 every part ran and passed, 1 a part failed, 2 no GPU answered.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
readonly start_s=$SECONDS
readonly deadline_s=$((start_s + ${ZINF_GPU_CHECK_SECONDS:-345}))
readonly build_dir=${ZINF_GPU_CHECK_BUILD_DIR:-build-gpu}
readonly out_dir=${OUT:-$build_dir/gpu-check}
readonly sysroot=${ZINF_GPU_CHECK_SYSROOT:-/tmp/sysroot}
# GPT-2 medium's blocks (24 layers, width 1024) on byte tokens (vocab 256): ~302M parameters,
# 578 MiB in bf16. The device budget, computed for the CUDA backend (the executor's refusal
# names the same sum; python3 arithmetic from src/train/gpt.cc and kernels/cuda/attention_ops.cu):
#   executor buffers at 2 x 512 tokens  452.2 MiB  (activations with the CUDA attention scratch,
#                                                   one unit's fp32 weights and gradients)
#   cuBLAS workspace                     32.0 MiB  (kCublasWorkspaceBytes, from the arena)
#   CUDA backend's dloss buffer           4 KiB
#   one copy of each unit size           25.5 MiB  (a block's bf16 weights 24.0 MiB, the
#                                                   embedding 1.5 MiB, the final norm 4 KiB)
#   = 509.7 MiB at the least; 656 MiB leaves room for 6 more blocks' copies (prefetch), far below
#   the 1062 MiB that would hold every block at once: the weights page through the device every
#   step (device_evictions in the table). Optimizer state and param16 homes in host memory
#   (--offload cpu, pinned) keep the run short whatever the machine's disk.
readonly train_flags=${ZINF_GPU_CHECK_TRAIN_FLAGS:---layers 24 --width 1024 --heads 16 --vocab 256 --seq-len 512 --batch 2 --offload cpu --device-budget 656M --pinned-budget 4G}
# A broken device rule (a CUDA call from a stream callback, a free of memory in use) aborts with
# its message instead of hanging or corrupting memory.
export ZINF_DEVICE_RULES=abort
mkdir -p "$out_dir"
readonly setup_log=$out_dir/setup.log
: >"$setup_log"

declare -A result  # part -> one-line outcome for the table
failed=0
last_stage="none"  # the last stage that completed, named when something hangs
note() { echo "[gpu_check $((SECONDS - start_s))s] $*" | tee -a "$setup_log" >&2; }
stage_done() { last_stage=$1; note "stage done: $1"; }
# What a part's exit status says; a part killed by its timeout (a hang, or too slow) says so and
# names the last stage that completed.
outcome() {  # $1 rc, $2 seconds allowed
  case $1 in
    0) echo "ok" ;;
    124 | 137) echo "TIMED OUT: killed after $2 s, hung or too slow (last completed stage: $last_stage)" ;;
    *) echo "FAILED (rc $1)" ;;
  esac
}
# The watchdog: past the overall deadline (plus a grace period), the script is told to stop;
# the EXIT trap still prints the table with what completed.
( sleep $((deadline_s - start_s + 60)) && kill -TERM $$ 2>/dev/null ) &
watchdog_pid=$!
summary_printed=0
on_term() {
  result[watchdog]="the whole check ran past its deadline; last completed stage: $last_stage"
  failed=1
  exit 1
}
trap on_term TERM

# ---- summary table: printed last, also when a stage fails or the watchdog fires ----------------
print_summary() {
[ "$summary_printed" -eq 1 ] && return
summary_printed=1
kill "$watchdog_pid" 2>/dev/null
summary_txt=$out_dir/summary.txt
python3 - "${bw_json:-/nonexistent}" "${train_json:-/nonexistent}" "${result[build]:-not run}" \
  "${result[tests]:-not run}" "${result[train]:-not run}" "$((SECONDS - start_s))" \
  "${train_used_flags:-}" "${result[watchdog]:-}" "$last_stage" "${result[python]:-not run}" \
  "${result[nvme]:-not run}" "${plan_json:-/nonexistent}" >"$summary_txt" <<'PY'
import json, sys
bw_path, train_path, build, tests, train, elapsed, flags, watchdog, last, python, nvme, \
    plan_path = sys.argv[1:13]

def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except Exception as e:  # missing or not JSON
        return {"error": f"{path}: {e.__class__.__name__}"}

bw, tr = load(bw_path), load(train_path)

def num(d, k, fmt, scale=1.0):
    v = d.get(k)
    return fmt.format(v * scale) if isinstance(v, (int, float)) else "n/a"

rows = [("build (CUDA, sm_90)", build), ("gpu ops/tests (ctest -L gpu)", tests)]
if "error" in bw:
    rows.append(("GPU / bandwidth probe", bw["error"]))
else:
    rows += [("GPU", bw.get("device", "?")),
             ("H2D pinned GB/s", num(bw, "h2d_gbps", "{:.1f}")),
             ("D2H pinned GB/s", num(bw, "d2h_gbps", "{:.1f}")),
             ("MatmulForward TFLOPS bf16/tf32/fp32",
              "/".join(num(bw, k, "{:.0f}") for k in
                       ("matmul_tflops_bf16", "matmul_tflops_tf32", "matmul_tflops_fp32"))
              + f" (n={bw.get('gemm_n')})")]
rows.append(("train (zinf train --device cuda)", train))
if train.startswith("ok"):
    rows.append(("train flags", flags))
if "error" not in tr:
    params, tps, step = tr.get("params"), tr.get("tokens_per_s"), tr.get("step_seconds_median")
    tflops = 6.0 * params * tps / 1e12 if isinstance(params, (int, float)) and \
        isinstance(tps, (int, float)) else None
    rows += [("backend / device", f"{tr.get('backend', '?')} / {tr.get('device', '?')}"),
             ("steps / loss first -> final",
              f"{tr.get('steps')} / {num(tr, 'first_loss', '{:.4f}')} -> "
              f"{num(tr, 'final_loss', '{:.4f}')}"),
             ("params", num(tr, "params", "{:,.0f}")),
             ("step time median (s)", num(tr, "step_seconds_median", "{:.4f}")),
             ("tokens/s", num(tr, "tokens_per_s", "{:,.0f}")),
             ("TFLOPS (6*params*tokens/s)", f"{tflops:.2f}" if tflops is not None else "n/a"),
             ("stall fraction", num(tr, "stall_fraction", "{:.3f}")),
             ("device evictions / h2d / d2h (GB)",
              num(tr, "device_evictions", "{:.0f}") + " / " +
              num(tr, "h2d_bytes", "{:.2f}", 1e-9) + " / " + num(tr, "d2h_bytes", "{:.2f}", 1e-9)),
             ("peak device / budget (MiB)",
              num(tr, "peak_device_bytes", "{:.0f}", 2**-20) + " / " +
              num(tr, "device_budget_bytes", "{:.0f}", 2**-20)),
             ("NVMe read / write (GB)",
              num(tr, "nvme_read_bytes", "{:.2f}", 1e-9) + " / " +
              num(tr, "nvme_write_bytes", "{:.2f}", 1e-9))]
pl = load(plan_path)
if "error" not in pl:
    t = pl.get("seconds", {})
    rows.append(("zinf plan: predicted step (s) / bound",
                 num(t, "step", "{:.4f}") + " / " + str(pl.get("bound", "?")) +
                 "  (compute " + num(t, "compute", "{:.4f}") + ", adam " +
                 num(t, "adam", "{:.4f}") + ")"))
rows.append(("python3 tests on cuda (torch.offload)", python))
rows.append(("train on NVMe (default job)", nvme))
rows.append(("last completed stage", last))
if watchdog:
    rows.append(("WATCHDOG", watchdog))
rows.append(("elapsed (s)", elapsed))
width = max(len(k) for k, _ in rows)
print("=" * (width + 40))
print("zinf gpu_check summary")
print("-" * (width + 40))
for k, v in rows:
    print(f"{k:<{width}}  {v}")
print("=" * (width + 40))
PY
py_rc=$?
if [ $py_rc -ne 0 ]; then  # no python3: a plain table
  {
    echo "zinf gpu_check summary"
    echo "build: ${result[build]:-}"; echo "tests: ${result[tests]:-}"
    echo "bandwidth: $(cat "${bw_json:-/dev/null}" 2>/dev/null)"; echo "train: ${result[train]:-}"
    echo "python: ${result[python]:-}"; echo "nvme: ${result[nvme]:-}"
    echo "last completed stage: $last_stage"
    [ -n "${result[watchdog]:-}" ] && echo "WATCHDOG: ${result[watchdog]}"
    [ -f "${train_json:-}" ] && echo "train.json: $(cat "$train_json")"
  } >"$summary_txt"
fi
[ "${gpu_present:-0}" -eq 0 ] && echo "NOTE: no GPU answered on this machine; GPU parts were skipped." >>"$summary_txt"
cat "$summary_txt"
}
trap print_summary EXIT
# Seconds a part may take: its cap, or what is left before the deadline minus a reserve.
budget() {
  local cap=$1 left=$((deadline_s - SECONDS - ${2:-5}))
  ((left < cap)) && cap=$left
  ((cap < 1)) && cap=1
  echo "$cap"
}
# Trims a log so that it comes back from $OUT (16 MiB per file).
trim() { [ -f "$1" ] && [ "$(stat -c %s "$1")" -gt 8000000 ] && tail -c 8000000 "$1" >"$1.t" && mv "$1.t" "$1"; }

# ---- (a) packages ----------------------------------------------------------------------------
if [ -d .debs ] && [[ ":${CMAKE_PREFIX_PATH:-}:" != *":$sysroot/usr:"* ]]; then
  if [ -f .debs/unpack-debs.sh ]; then
    note "unpacking .debs into $sysroot"
    if exports=$(timeout "$(budget 60)" bash .debs/unpack-debs.sh .debs "$sysroot" 2>>"$setup_log"); then
      eval "$exports"
    else
      note "unpack-debs.sh failed"
    fi
  else
    note ".debs has no unpack-debs.sh (copy ../shared/device/unpack-debs.sh there)"
  fi
fi
# pkg-config carried as a package (pkgconf pkgconf-bin libpkgconf3) when the image lacks it.
if ! command -v pkg-config >/dev/null 2>&1 && [ -x "$sysroot/usr/bin/pkg-config" ]; then
  export PATH="$sysroot/usr/bin:$PATH"
fi
command -v pkg-config >/dev/null 2>&1 || note "no pkg-config: configure will fail (carry pkgconf pkgconf-bin libpkgconf3)"
# The carried packages' .pc files name /usr: pkg-config prefixes the sysroot to their paths.
# OpenBLAS's openblas.pc is reached on Debian through an alternatives link that is not carried.
if [ -d "$sysroot/usr/lib/x86_64-linux-gnu/pkgconfig" ]; then
  export PKG_CONFIG_SYSROOT_DIR=$sysroot
  export PKG_CONFIG_LIBDIR=$sysroot/usr/lib/x86_64-linux-gnu/pkgconfig:$sysroot/usr/lib/x86_64-linux-gnu/openblas-pthread/pkgconfig:$sysroot/usr/share/pkgconfig
fi
# Some CMake package files name their library by absolute path (Gloo's: IMPORTED_LOCATION
# "/usr/lib/libgloo.so.0.5.0"); point those at the sysroot. The rehearsal here cannot catch
# this, since this machine has the same files under /usr.
if [ -d "$sysroot/usr" ]; then
  while IFS= read -r f; do
    sed -i -E "s#\"/usr/(lib|include)/#\"$sysroot/usr/\\1/#g" "$f"
    note "rewrote /usr paths to $sysroot in ${f#"$sysroot"/}"
  done < <(grep -rlE '(IMPORTED_LOCATION[A-Z_]*|_cmake_import_check_files_for_[A-Za-z_]*) "/usr/' \
             "$sysroot/usr/share/cmake" "$sysroot/usr/lib/x86_64-linux-gnu/cmake" "$sysroot/usr/lib/cmake" 2>/dev/null)
  export LD_LIBRARY_PATH="$sysroot/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

# ---- (b) configure and build -----------------------------------------------------------------
nvcc_bin=$(command -v nvcc || true)
[ -z "$nvcc_bin" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc
generator=()
keep_going=(-k)
if command -v ninja >/dev/null 2>&1 && [ ! -f "$build_dir/Makefile" ]; then
  generator=(-G Ninja)
  keep_going=(-k 0)
fi
[ -f "$build_dir/build.ninja" ] && keep_going=(-k 0)
cores=${ZINF_GPU_CHECK_JOBS:-$(nproc 2>/dev/null || echo 4)}
note "configure $build_dir (nvcc: ${nvcc_bin:-none})"
timeout "$(budget 60)" cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DZINF_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ${nvcc_bin:+-DCMAKE_CUDA_COMPILER=$nvcc_bin} \
  >>"$setup_log" 2>&1
configure_rc=$?
build_rc=1
if [ $configure_rc -eq 0 ]; then
  targets=()
  for t in ${ZINF_GPU_CHECK_TARGETS:-}; do targets+=(--target "$t"); done
  note "build ${ZINF_GPU_CHECK_TARGETS:-all targets} with $cores jobs"
  build_cap=$(budget 200 120)
  timeout "$build_cap" cmake --build "$build_dir" -j "$cores" "${targets[@]}" -- \
    "${keep_going[@]}" >>"$setup_log" 2>&1
  build_rc=$?
  result[build]="$(outcome $build_rc "$build_cap")$([ $build_rc -ne 0 ] && echo ", see setup.log")"
  [ $build_rc -eq 0 ] && stage_done build
else
  result[build]="configure FAILED (rc $configure_rc, see setup.log)"
fi
[ $build_rc -ne 0 ] && failed=1
grep -E "error:|Error [0-9]+|CMake Error" "$setup_log" | head -20 >&2
trim "$setup_log"

# ---- instead of (c)-(h): another script on this build (ZINF_GPU_CHECK_EXTRA) ------------------
# For a second run in the same session: the script gets the build folder and $out_dir, has what
# is left of the deadline, and prints its own table last (bench/gpu_rows.sh).
if [ -n "${ZINF_GPU_CHECK_EXTRA:-}" ]; then
  trap - EXIT
  [ $build_rc -ne 0 ] && { echo "build FAILED: see $setup_log"; exit 1; }
  note "running $ZINF_GPU_CHECK_EXTRA instead of parts (c)-(h)"
  ZINF_GPU_ROWS_SECONDS=$((deadline_s - SECONDS - 10)) timeout "$(budget 3000 5)" \
    bash "$ZINF_GPU_CHECK_EXTRA" "$build_dir" "$out_dir"
  exit $?
fi

# ---- (c) gpu-labelled tests ------------------------------------------------------------------
ctest_log=$out_dir/ctest.log
if [ -f "$build_dir/CTestTestfile.cmake" ]; then
  note "ctest -L gpu"
  ctest_cap=$(budget 90 90)
  timeout "$ctest_cap" ctest --test-dir "$build_dir" -L gpu --output-on-failure \
    --timeout 80 -j 4 >"$ctest_log" 2>&1
  ctest_rc=$?
  summary=$(grep -E "tests passed|No tests were found" "$ctest_log" | tail -1)
  total=$(sed -nE 's/.* out of ([0-9]+).*/\1/p' <<<"$summary")
  nfail=$(sed -nE 's/.*, ([0-9]+) tests? failed.*/\1/p' <<<"$summary")
  nskip=$(grep -c "(Skipped)" "$ctest_log")  # gtest cases ctest lists as skipped
  if [ -n "$total" ]; then
    result[tests]="$((total - ${nfail:-0})) passed, ${nfail:-0} failed of $total ctest cases"
    [ "$nskip" -gt 0 ] && result[tests]+=" ($nskip of them skipped)"
  else
    result[tests]="no result ($(outcome $ctest_rc "$ctest_cap"); ${summary:-see ctest.log})"
  fi
  # A test that hung past ctest's own timeout is named by ctest ("Timeout").
  hung=$(grep -E "\(Timeout\)" "$ctest_log" | head -3 | sed -E 's/.* - ([^ ]+) .*/\1/' | tr '\n' ' ')
  [ -n "$hung" ] && result[tests]+="; TIMED OUT: $hung"
  [ $ctest_rc -eq 0 ] && stage_done tests
  [ $ctest_rc -ne 0 ] && failed=1
  trim "$ctest_log"
else
  result[tests]="not run (no build)"
fi

# ---- (f) the Python package on CUDA tensors ----------------------------------------------------
# tests/python under this machine's python3 and torch (not Debian's): zinf.torch.offload with the
# model, the batches and zinf's device tier on the GPU, the AioHandle and CPUAdam cases as on the
# CPU. ZINF_TEST_VERBOSE prints the loss and weight differences against plain PyTorch.
python_log=$out_dir/python.log
zinf_lib=$(ls "$build_dir"/src/capi/libzinf.so 2>/dev/null | head -1)
if [ -z "$zinf_lib" ]; then
  result[python]="not run: libzinf.so was not built"
elif ! python3 -c "import torch; assert torch.cuda.is_available()" >>"$setup_log" 2>&1; then
  result[python]="not run: python3's torch sees no GPU"
else
  note "python3 -m unittest (ZINF_TEST_DEVICE=cuda)"
  py_cap=$(budget 90 150)
  (cd tests/python && ZINF_TEST_DEVICE=cuda ZINF_TEST_VERBOSE=1 ZINF_LIBRARY="$PWD/../../$zinf_lib" \
     PYTHONPATH="$PWD/../../python" PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
     timeout "$py_cap" python3 -m unittest -v test_torch_offload test_torch_precision \
       test_torch_guard test_zinf test_engine) \
    >"$python_log" 2>&1
  py_rc=$?
  ran=$(grep -oE "^Ran [0-9]+ tests?" "$python_log" | tail -1)
  verdict=$(grep -E "^(OK|FAILED)" "$python_log" | tail -1)
  diffs=$(grep -E "^max loss rel diff" "$python_log" | head -1 | cut -c1-120)
  result[python]="$(outcome $py_rc "$py_cap"): ${ran:-no result} ${verdict:-}${diffs:+; $diffs}"
  [ $py_rc -eq 0 ] && stage_done python
  [ $py_rc -ne 0 ] && failed=1
  trim "$python_log"
fi

# ---- (d) bandwidth probe ---------------------------------------------------------------------
bw_json=$out_dir/bandwidth.json
gpu_present=0
command -v nvidia-smi >/dev/null 2>&1 &&
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader >>"$setup_log" 2>&1
if [ -x "$build_dir/bench/gpu_bandwidth" ]; then
  note "gpu_bandwidth"
  bw_cap=$(budget 40 60)
  timeout "$bw_cap" "$build_dir/bench/gpu_bandwidth" >"$bw_json" 2>>"$setup_log"
  bw_rc=$?
  if [ $bw_rc -eq 124 ] || [ $bw_rc -eq 137 ]; then
    echo "{\"error\": \"gpu_bandwidth $(outcome $bw_rc "$bw_cap")\"}" >"$bw_json"
  fi
  grep -q '"h2d_gbps"' "$bw_json" && gpu_present=1 && stage_done bandwidth
  [ $bw_rc -ne 0 ] && ! grep -q "no CUDA device" "$bw_json" && failed=1
else
  echo '{"error": "bench/gpu_bandwidth was not built"}' >"$bw_json"
fi
[ $gpu_present -eq 0 ] && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 &&
  gpu_present=1

# ---- (e) short training on the GPU -----------------------------------------------------------
# When the budget is refused ("... expected at least N"), the run is repeated with N + 32 MiB
# (at most twice), so that the check still yields figures; the table says so.
train_json=$out_dir/train.json
train_log=$out_dir/train.log
train_used_flags=$train_flags
rm -f "$train_json"
run_train() {  # $1: a --device-budget that replaces the flags' one, or empty
  local -a flags cmd
  read -r -a flags <<<"$train_flags"
  if [ -n "${1:-}" ]; then
    local i found=0
    for i in "${!flags[@]}"; do
      if [ "${flags[$i]}" = --device-budget ]; then flags[i+1]=$1; found=1; fi
    done
    [ $found -eq 0 ] && flags+=(--device-budget "$1")
    train_used_flags="${flags[*]}"
  fi
  cmd=("$build_dir/zinf" train --device cuda --steps "${ZINF_GPU_CHECK_STEPS:-20}" "${flags[@]}"
       --summary-json "$train_json")
  note "${cmd[*]}"
  train_cap=$(budget "$2" 5)
  timeout "$train_cap" "${cmd[@]}" >>"$train_log" 2>&1
}
if [ ! -x "$build_dir/zinf" ]; then
  result[train]="not run: $build_dir/zinf was not built"
elif ! "$build_dir/zinf" train --help >/dev/null 2>&1; then
  result[train]="not run: this zinf has no 'train' subcommand yet"
elif [ $gpu_present -eq 0 ]; then
  result[train]="not run: no GPU answers"
else
  : >"$train_log"
  run_train "" 100
  train_rc=$?
  retried=""
  last_need=""
  # Up to two raises: the config check and the executor each name their own minimum.
  for _ in 1 2; do
    need=$(grep -oE "expected at least [0-9]+" "$train_log" | grep -oE "[0-9]+$" | tail -1)
    if [ $train_rc -eq 0 ] || [ -z "$need" ] || [ "$need" = "$last_need" ] ||
       [ $((deadline_s - SECONDS)) -lt 40 ]; then
      break
    fi
    last_need=$need
    retried=" (budget raised to $(((need >> 20) + 32))M: refused, needs >= $((need >> 20)) MiB)"
    run_train "$(((need >> 20) + 32))M" 100
    train_rc=$?
  done
  if [ $train_rc -eq 0 ] && [ -s "$train_json" ]; then
    result[train]="ok$retried"
    stage_done train
  else
    # The last progress line says how far it got (the step, or nothing: it hung at start).
    last_step=$(grep -oE "^step +[0-9]+/[0-9]+" "$train_log" | tail -1)
    result[train]="$(outcome $train_rc "$train_cap")$retried, ${last_step:-no step done}, see train.log"
    failed=1
  fi
  trim "$train_log"
fi

# ---- (g) zinf plan with the training's flags: predicted against (e)'s measured step ------------
plan_json=$build_dir/plan.json
rm -f "$plan_json"
if [ -x "$build_dir/zinf" ] && [ $gpu_present -eq 1 ]; then
  read -r -a plan_flags <<<"$train_used_flags"
  plan_cap=$(budget 45 40)
  note "zinf plan --device cuda $train_used_flags --json within $plan_cap s"
  echo "---- zinf plan --device cuda ${plan_flags[*]} --json" >>"$train_log"
  timeout "$plan_cap" "$build_dir/zinf" plan --device cuda "${plan_flags[@]}" --json \
    >"$plan_json" 2>>"$train_log"
  plan_rc=$?
  cat "$plan_json" >>"$train_log"
  [ $plan_rc -eq 0 ] && stage_done plan
fi

# ---- (h) the default job on the GPU: weights, gradients and Adam state on NVMe ------------------
nvme_log=$out_dir/nvme.log
if [ -x "$build_dir/zinf" ] && [ $gpu_present -eq 1 ]; then
  nvme_cap=$(budget 60 5)
  note "zinf train --device cuda --steps 10 (default job, NVMe) within $nvme_cap s"
  # The default job's device budget (44 MiB) is sized for the host backend; cuBLAS's workspace
  # and the CUDA attention scratch need more (the executor's refusal names the sum: ~81 MiB).
  timeout "$nvme_cap" "$build_dir/zinf" train --device cuda --steps 10 --device-budget 128M \
    --swap-dir "$build_dir/nvme-swap" >"$nvme_log" 2>&1
  nvme_rc=$?
  last_step=$(grep -E "^step +[0-9]+/[0-9]+" "$nvme_log" | tail -1 | cut -c1-100)
  result[nvme]="$(outcome $nvme_rc "$nvme_cap")${last_step:+: $last_step}"
  [ $nvme_rc -eq 0 ] && stage_done nvme
  [ $nvme_rc -ne 0 ] && failed=1
  trim "$nvme_log"
else
  result[nvme]="not run (no zinf or no GPU)"
fi

print_summary
if [ $failed -ne 0 ]; then exit 1; fi
[ $gpu_present -eq 0 ] && exit 2
exit 0
