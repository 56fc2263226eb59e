#!/usr/bin/env bash
# The one GPU check of the cuda target, for a session that is lent a GPU. First, on the build
# machine, build the carried artifacts (cubins for sm_90 and the cpu build's outputs as .npy):
#
#     PYTHONPATH=. python tests/gpu/carried.py                 (into tests/gpu/carried, git-ignored)
#
# then run this once on the device machine, from the repository root, with that machine's own
# Python (torch, numba, numba-cuda, cuda-core, pytest-timeout and pytest-xdist preinstalled):
#
#     PYTHONPATH=. tests/gpu/device_check.sh     (device tool: carry ["tests/gpu/carried"], timeout_s 540)
#
# Stages, each time-boxed (seconds in brackets, shortened to what is left of the 470 s budget), in
# order; a failed or timed-out stage is recorded and the script goes on:
#   info [60]      driver, GPU, NVVM, nvJitLink, CUDA_HOME, versions, and a smoke compile of one
#                  kernel (tests/gpu/device_info.py); a toolchain problem skips jit and parity
#   carried [60]   the carried artifacts, which need nothing of this machine's compiler: ELF and
#                  arguments_info against the plan, eager and graph against the cpu build's outputs
#                  (bitwise for the + - * / chain and the optimizer), graph against eager (bitwise)
#   race [45]      outputs fed to a program on another stream (the __cuda_array_interface__ stream
#                  protocol both ways), bitwise against one program running both steps in order
#   grid [60]      x @ w with 1,100,000 rows (row tiles past grid.y's 65535) against numpy in float64
#   jit [120]      this machine's compiler: tests/cuda/test_cubin.py and tests/gpu/test_cubin_runtime.py
#   parity [120]   tests/gpu/test_gpu_parity.py at real sizes (-n 4 where pytest-xdist is installed)
#   bench_<name>   bench/run.py --target cuda --only <name> --json, while the budget lasts
# Every test runs with -v, a per-test --timeout where pytest-timeout is installed, and appends its
# result to $OUT/results.jsonl as soon as it ends (tests/gpu/record_results.py), so a stage killed
# at its limit still leaves what it found. $OUT (default ./device-out) gets six files: info.log,
# tests.log, bench.log, stages.jsonl (a line per stage: name, rc, seconds, timed_out),
# results.jsonl and summary.json (stages, info, per-stage test counts, failures, benchmark rows).
#
# BENDC_DRY_RUN=1: the dry run (tests/cuda/test_sim_device_check.py, in make test): no GPU; the
# carried artifacts are built first if missing, every test stage runs under numba's CUDA
# simulator (NUMBA_ENABLE_CUDASIM=1: tests/gpu/devices.py binds simulated devices), info checks
# the toolchain without a driver, the benchmarks are skipped, the chain is built on 8 rows, and the
# limits are 10 times longer (the machine running make test is shared; a simulated thread costs
# ~170 us and its barriers much more on a loaded machine).
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
DRY_RUN="${BENDC_DRY_RUN:-0}"
export PYTHONPATH="${PYTHONPATH:-.}:$PWD/tests/gpu" PYTHONUNBUFFERED=1
export BENDC_RESULTS="$OUT/results.jsonl" BENDC_CARRIED="${BENDC_CARRIED:-$PWD/tests/gpu/carried}"
for file in stages.jsonl results.jsonl bench.log tests.log info.log; do : > "$OUT/$file"; done
SCRIPT_START=$(date +%s)
BUDGET=470  # seconds for all stages together
SCALE=1     # stage limits times this: the dry run's machine is shared and simulates the GPU (10)

if [ "$DRY_RUN" = 1 ]; then
    SCALE=10
    BUDGET=$(( BUDGET * SCALE ))
    TESTS_ENV=(env NUMBA_ENABLE_CUDASIM=1)
    INFO_ARGS=(--no-driver)
else
    TESTS_ENV=(env)
    INFO_ARGS=()
fi
PYTEST=("$PY" -m pytest -v -p no:cacheprovider -rfE -p record_results)
if "$PY" -c "import pytest_timeout" 2>/dev/null; then
    PYTEST+=(--timeout=60)
fi
WORKERS=()
if [ "$DRY_RUN" != 1 ] && "$PY" -c "import xdist" 2>/dev/null; then
    WORKERS=(-n 4)
fi

record() {  # record NAME JSON-FIELDS: a stage that did not run
    echo "{\"name\": \"$1\", $2}" >> "$OUT/stages.jsonl"
}

stage() {  # stage NAME SECONDS LOG COMMAND...: run, time-boxed within the budget, output appended to LOG
    local name=$1 limit=$(( $2 * SCALE )) log=$3
    shift 3
    local left=$(( BUDGET - ($(date +%s) - SCRIPT_START) ))
    if [ "$left" -lt 15 ]; then
        record "$name" "\"skipped\": \"over the script's time budget\""
        return 99
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    local start end rc
    start=$(date +%s.%N)
    echo "=== $name [${limit} s]: $*" >> "$log"
    BENDC_STAGE="$name" timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    "$PY" -c 'import json, sys; n, rc, a, b = sys.argv[1:]; print(json.dumps({"name": n, "rc": int(rc),
        "seconds": round(float(b) - float(a), 1), "timed_out": int(rc) in (124, 137)}))' \
        "$name" "$rc" "$start" "$end" >> "$OUT/stages.jsonl" || record "$name" "\"rc\": $rc"
    echo "--- $name: rc $rc" | tee -a "$log"
    return "$rc"
}

stage info 60 "$OUT/info.log" env -u NUMBA_ENABLE_CUDASIM "$PY" tests/gpu/device_info.py "${INFO_ARGS[@]}"
TOOLCHAIN=$?
if [ ! -f "$BENDC_CARRIED/carried.json" ]; then
    if [ "$DRY_RUN" = 1 ]; then
        stage build_carried 120 "$OUT/tests.log" env -u NUMBA_ENABLE_CUDASIM "$PY" tests/gpu/carried.py "$BENDC_CARRIED" --small
    else
        echo "no carried artifacts in $BENDC_CARRIED: build them with tests/gpu/carried.py and carry the folder" \
            | tee -a "$OUT/tests.log"
    fi
fi
stage carried 60 "$OUT/tests.log" "${TESTS_ENV[@]}" "${PYTEST[@]}" tests/gpu/test_carried.py
stage race 45 "$OUT/tests.log" "${TESTS_ENV[@]}" "${PYTEST[@]}" tests/gpu/test_race_probe.py
stage grid 60 "$OUT/tests.log" "${TESTS_ENV[@]}" "${PYTEST[@]}" tests/gpu/test_grid_probe.py
if [ "$TOOLCHAIN" = 0 ]; then
    stage jit 120 "$OUT/tests.log" "${TESTS_ENV[@]}" "${PYTEST[@]}" tests/cuda/test_cubin.py tests/gpu/test_cubin_runtime.py
    stage parity 120 "$OUT/tests.log" "${TESTS_ENV[@]}" "${PYTEST[@]}" "${WORKERS[@]}" tests/gpu/test_gpu_parity.py
else
    record jit "\"skipped\": \"the toolchain check failed: see info.log\""
    record parity "\"skipped\": \"the toolchain check failed: see info.log\""
fi
for workload in launch_overhead elementwise mlp transformer attention gpt; do
    if [ "$DRY_RUN" = 1 ]; then
        record "bench_$workload" "\"skipped\": \"dry run\""
        continue
    fi
    case $workload in launch_overhead) limit=60 ;; transformer | gpt) limit=120 ;; *) limit=90 ;; esac
    stage "bench_$workload" "$limit" "$OUT/bench.log" "$PY" bench/run.py --target cuda --only "$workload" --json
done

"$PY" - "$OUT" <<'EOF' || echo "summary.json not written: see stages.jsonl and results.jsonl"
import json, os, sys
out = sys.argv[1]
def lines(name):
    with open(os.path.join(out, name), encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip().startswith("{")]
summary = {"stages": lines("stages.jsonl"), "tests": {}}
info = [record for record in lines("info.log") if "python" in record]
if info:
    summary["info"] = info[-1]
for result in lines("results.jsonl"):
    counts = summary["tests"].setdefault(result["stage"], {"passed": 0, "failed": 0, "skipped": 0, "failures": []})
    counts[result["outcome"]] = counts.get(result["outcome"], 0) + 1
    if result["outcome"] == "failed":
        counts["failures"].append(f"{result['test']}: {result.get('message', '')}")
summary["bench"] = []
for record in lines("bench.log"):
    if "machine" in record:
        summary.setdefault("bench_machine", record["machine"])
        summary["bench"].extend(record["workloads"])
with open(os.path.join(out, "summary.json"), "w", encoding="utf-8") as stream:
    json.dump(summary, stream, indent=1)
print(json.dumps({stage: {k: v for k, v in counts.items() if k != "failures"}
                  for stage, counts in summary["tests"].items()}))
for row in summary["bench"]:
    print(json.dumps(row))
EOF
