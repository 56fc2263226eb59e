#!/usr/bin/env bash
# The one GPU check of the cuda target, for a session that is lent a GPU: run once on the device
# machine, from the repository root, with that machine's own Python (torch, numba, numba-cuda,
# cuda-core preinstalled; no package registry there):
#
#     PYTHONPATH=. tests/gpu/device_check.sh            (the device tool: timeout_s 540)
#
# Stages, each time-boxed (seconds in brackets), in order of what matters most; a failed or timed
# out stage is recorded and the script goes on:
#   info [45]        driver, device, versions, the GPU's architecture as cuda.core sees it
#   offline [90]     tests/cuda/test_cubin.py on this machine's Python (records vs the cubins' ELF)
#   gpu_resident [90]  tests/gpu/test_cubin_runtime.py's resident-parameter and jit-on-cubins checks:
#                    donated parameters updated in place and fed back with no copy (bitwise vs cpu),
#                    torch tensors over the same buffers, bendc.jit(target="cuda") on this GPU's cubins
#   gpu_tests [200]  the rest of tests/gpu: parity at real sizes; the cubin runtime (graph, eager) vs
#                    numba vs cpu, bitwise for the + - * / chain; torch tensors on torch's stream
#   bench_<name> [60 to 120 each]  bench/run.py --target cuda --only <name> --json, while the budget lasts
# Total at most 8 minutes (470 s and one stage's kill grace). Everything lands in $OUT (default
# ./device-out): the logs (info.log, tests.log, bench.log), junit files of the three test stages,
# stages.jsonl (a line per stage: name, rc, seconds, timed_out) and summary.json (the stages, the
# info, the test counts and the benchmark rows). The device tool brings back at most 8 files (these
# are 8), so the benchmarks' rows go into summary.json and their logs into one file.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/device-out}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONPATH="${PYTHONPATH:-.}" PYTHONUNBUFFERED=1
: > "$OUT/stages.jsonl"
: > "$OUT/bench.log"
SCRIPT_START=$(date +%s)
BUDGET=470  # seconds: a benchmark starts only if it would end (at its limit) within this

stage() {  # stage NAME SECONDS LOG COMMAND...: run, time-boxed, its output appended to LOG
    local name=$1 limit=$2 log=$3
    shift 3
    local start end rc
    start=$(date +%s.%N)
    echo "=== $name: $*" >> "$log"
    timeout --kill-after=10 "$limit" "$@" >> "$log" 2>&1
    rc=$?
    end=$(date +%s.%N)
    "$PY" -c 'import json, sys; n, rc, a, b = sys.argv[1:]; print(json.dumps({"name": n, "rc": int(rc),
        "seconds": round(float(b) - float(a), 1), "timed_out": int(rc) in (124, 137)}))' \
        "$name" "$rc" "$start" "$end" >> "$OUT/stages.jsonl" \
        || echo "{\"name\": \"$name\", \"rc\": $rc}" >> "$OUT/stages.jsonl"
    echo "--- $name: rc $rc" | tee -a "$log"
}

stage info 45 "$OUT/info.log" "$PY" tests/gpu/device_info.py
stage offline 90 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider -rfE tests/cuda/test_cubin.py \
    --junitxml="$OUT/offline.xml"
RESIDENT="donated or resident or jit_cuda"
stage gpu_resident 90 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider -rfE \
    tests/gpu/test_cubin_runtime.py -k "$RESIDENT" --junitxml="$OUT/gpu_resident.xml"
stage gpu_tests 200 "$OUT/tests.log" "$PY" -m pytest -q -p no:cacheprovider -rfE tests/gpu -k "not ($RESIDENT)" \
    --junitxml="$OUT/gpu_tests.xml"
for workload in launch_overhead elementwise mlp transformer attention gpt; do
    case $workload in launch_overhead) limit=60 ;; transformer | gpt) limit=120 ;; *) limit=90 ;; esac
    if [ $(( $(date +%s) - SCRIPT_START + limit )) -gt "$BUDGET" ]; then
        echo "{\"name\": \"bench_$workload\", \"skipped\": \"over the script's time budget\"}" >> "$OUT/stages.jsonl"
        continue
    fi
    stage "bench_$workload" "$limit" "$OUT/bench.log" "$PY" bench/run.py --target cuda --only "$workload" --json
done

"$PY" - "$OUT" <<'EOF' || echo "summary.json not written: see stages.jsonl"
import json, os, sys, xml.etree.ElementTree as ET
out = sys.argv[1]
summary = {"stages": [json.loads(line) for line in open(os.path.join(out, "stages.jsonl")) if line.strip()]}
for line in open(os.path.join(out, "info.log")):
    if line.startswith("{"):
        summary["info"] = json.loads(line)
for name in ("offline", "gpu_resident", "gpu_tests"):
    try:
        suite = ET.parse(os.path.join(out, f"{name}.xml")).getroot()
        suite = suite if suite.tag == "testsuite" else suite[0]
        summary[name] = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        summary[name]["failed"] = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
                                   if case.find("failure") is not None or case.find("error") is not None]
    except Exception as error:  # noqa: BLE001 - the stage's log says why
        summary[name] = {"error": str(error)}
summary["bench"] = []
for line in open(os.path.join(out, "bench.log")):
    if line.startswith('{"machine"'):
        record = json.loads(line)
        summary.setdefault("bench_machine", record["machine"])
        summary["bench"].extend(record["workloads"])
with open(os.path.join(out, "summary.json"), "w") as stream:
    json.dump(summary, stream, indent=1)
print(json.dumps({k: summary[k] for k in ("offline", "gpu_resident", "gpu_tests") if k in summary}))
for row in summary["bench"]:
    print(json.dumps(row))
EOF
