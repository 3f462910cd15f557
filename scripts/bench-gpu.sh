#!/usr/bin/env bash
# GPU figures: ferrite vs upstream's cuda driver on the same modules, GPU
# and flags, interleaved over ROUNDS rounds (benches/hal/add.mlir,
# chain100.mlir, benches/cuda/matmul2048.mlir compiled for cuda sm_80).
# Prints per case the median per-call time of each runtime, the ratio
# ferrite/upstream and each one's peak RSS.
# With MINILM_WEIGHTS (a MiniLM-shaped .safetensors, e.g. from
# `scripts/bench-model.py --random-weights W`) and $MODULES/bench_minilm.vmfb
# (examples/minilm/minilm_cuda.vmfb), the encoder is timed too (batch 1,
# seq 128, weights as parameters).
# With JSON_OUT=file, the rounds and medians also go there as JSON, and
# scripts/plot-gpu.py draws them (time per call, both runtimes, per case).
# Usage: FERRITE=... UPSTREAM_BIN=... MODULES=dir scripts/bench-gpu.sh
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FERRITE=${FERRITE:-$ROOT/target/release/ferrite}
UPSTREAM_BIN=${UPSTREAM_BIN:?set UPSTREAM_BIN to the directory of upstream iree-benchmark-module}
MODULES=${MODULES:?set MODULES to the directory of bench_*.vmfb}
ROUNDS=${ROUNDS:-3}
MIN_TIME=${MIN_TIME:-0.5}
cases=(
  "add add --input=4xf32=1,2,3,4 --input=4xf32=10"
  "chain100 chain --input=16xf32=1"
  "matmul2048 matmul --input=2048x2048xf32=0.5 --input=2048x2048xf32=2"
)
if [ -n "${MINILM_WEIGHTS:-}" ]; then
  cases+=("minilm embed --parameters=model=$MINILM_WEIGHTS --input=1x128xi64=1 --input=1x128xi64=1")
fi
time_of() { # prints "<ns per call> <rss KB>"
  local out
  out=$(/usr/bin/time -f "RSS %M" "$@" --benchmark_min_time="$MIN_TIME" 2>&1)
  local t unit
  read -r t unit < <(echo "$out" | grep -E "^BM_" | head -1 | awk '{print $2, $3}')
  local rss
  rss=$(echo "$out" | grep -o "RSS [0-9]*" | tail -1 | cut -d' ' -f2)
  python3 -c "import sys; t,u=float(sys.argv[1]),sys.argv[2]; print(int(t*{'ns':1,'us':1e3,'ms':1e6,'s':1e9}[u]), sys.argv[3])" "${t:-0}" "${unit:-ns}" "${rss:-0}"
}
printf "%-12s %12s %12s %7s %10s %10s\n" case ferrite upstream ratio rss_fe_KB rss_up_KB
for c in "${cases[@]}"; do
  set -- $c
  name=$1 fn=$2
  shift 2
  fe=()
  up=()
  rfe=0
  rup=0
  # One untimed run of each first: the driver JIT-compiles a PTX module
  # the first time it sees it (caching the result on disk), which costs
  # whichever runtime goes first tens of MB of peak RSS.
  "$FERRITE" benchmark-module --device=cuda --module="$MODULES/bench_$name.vmfb" --function="$fn" "$@" --benchmark_min_time=0.01 >/dev/null 2>&1
  "$UPSTREAM_BIN/iree-benchmark-module" --device=cuda --module="$MODULES/bench_$name.vmfb" --function="$fn" "$@" --benchmark_min_time=0.01 >/dev/null 2>&1
  for _ in $(seq "$ROUNDS"); do
    read -r t r < <(time_of "$FERRITE" benchmark-module --device=cuda --module="$MODULES/bench_$name.vmfb" --function="$fn" "$@")
    fe+=("$t")
    [ "$r" -gt "$rfe" ] && rfe=$r
    read -r t r < <(time_of "$UPSTREAM_BIN/iree-benchmark-module" --device=cuda --module="$MODULES/bench_$name.vmfb" --function="$fn" "$@")
    up+=("$t")
    [ "$r" -gt "$rup" ] && rup=$r
  done
  python3 - "$name" "${fe[*]}" "${up[*]}" "$rfe" "$rup" "${JSON_OUT:-}" <<'PY'
import json, os, statistics, sys
name, fe_all, up_all, rfe, rup, out = sys.argv[1:]
fe_all, up_all = [int(v) for v in fe_all.split()], [int(v) for v in up_all.split()]
fe, up = statistics.median(fe_all), statistics.median(up_all)
if out:
    doc = json.load(open(out)) if os.path.exists(out) else {"cases": {}}
    doc["cases"][name] = {"ferrite_ns": fe, "upstream_ns": up, "ferrite_all": fe_all,
                          "upstream_all": up_all, "ferrite_rss_kb": int(rfe), "upstream_rss_kb": int(rup)}
    json.dump(doc, open(out, "w"), indent=1)
f = lambda ns: f"{ns/1e3:.1f} us" if ns < 1e6 else f"{ns/1e6:.2f} ms"
print(f"{name:<12} {f(fe):>12} {f(up):>12} {fe/up if up else float('nan'):7.2f} {rfe:>10} {rup:>10}")
PY
done
