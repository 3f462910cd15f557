#!/usr/bin/env bash
# The GPU suite, run on a machine with an NVIDIA GPU: the CUDA driver's
# Rust GPU tests (FERRITE_REQUIRE_GPU=1: a skip is a failure), the CPU/GPU
# differential over tests/cuda/cases.txt (outputs on --device=cuda equal
# to --device=local-task, and to upstream's iree-run-module --device=cuda
# when UPSTREAM_BIN is set), and upstream's e2e check suites compiled for
# cuda (scripts/gpu-e2e-build.sh) under `ferrite check-module
# --device=cuda`. Prints per-part counts and `N passed, M failed`; exits 1
# on any failure.
#
# Inputs (built elsewhere and carried to the GPU machine):
#   FERRITE       the ferrite binary                 (default target/release/ferrite)
#   GPU_TESTS     directory of the driver's test executables (gpu, gpu_fault,
#                 nccl, cts: the HAL conformance suite on cuda; multi_gpu is
#                 skipped here: scripts/test-multi-gpu.sh runs it on 2 GPUs)
#   FERRITE_CTS_MODULES  the conformance suite's modules compiled for cuda
#                 (`cargo run -p ferrite-hal-cts --bin cts-modules DIR`);
#                 default $GPU_TESTS/cts-modules
#   FERRITE_NCCL_LIBRARY  libnccl.so.2 for the nccl tests (default: the copy
#                 of python3's nvidia-nccl package, as PyTorch installs it)
#   DIFF_DIR      <case>.cuda.vmfb/<case>.cpu.vmfb and cases.txt
#   CHECK_DIR     <name>.cuda.vmfb/<name>.cpu.vmfb of tests/cuda/checks
#                 (optional): check programs whose functions run after each
#                 other in one process (what one leaves behind can affect
#                 the next), each passing on cuda and on local-task
#   E2E_DIR       <suite>/<name>.vmfb (optional)
#   UPSTREAM_BIN  directory with upstream's iree-run-module (optional)
#   UPSTREAM_PYTHONPATH  where upstream's `iree.runtime` imports from
#                 (optional): the e2e suites are then also run under
#                 upstream's cuda driver, with the checks evaluated by
#                 scripts/check-with-python.py (the wheel has no
#                 iree-check-module), and both counts are printed side by
#                 side; upstream's failures do not count here
#   E2E_ONLY      set to 1 to run only the e2e part
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
FERRITE=${FERRITE:-$ROOT/target/release/ferrite}
GPU_TESTS=${GPU_TESTS:?set GPU_TESTS to the directory of the CUDA driver test executables}
DIFF_DIR=${DIFF_DIR:?set DIFF_DIR to the compiled differential modules}
CHECK_DIR=${CHECK_DIR:-}
E2E_DIR=${E2E_DIR:-}
UPSTREAM_BIN=${UPSTREAM_BIN:-}
LOG=${LOG:-/dev/null}
pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  echo "FAIL: $*"
}

if [ -z "${FERRITE_NCCL_LIBRARY:-}" ]; then
  FERRITE_NCCL_LIBRARY=$(python3 -c 'import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = [p for r in roots for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so.2"), recursive=True))]
print(hits[0] if hits else "")' 2>/dev/null || true)
  export FERRITE_NCCL_LIBRARY
fi

if [ "${E2E_ONLY:-}" != 1 ]; then
export FERRITE_CTS_MODULES=${FERRITE_CTS_MODULES:-$GPU_TESTS/cts-modules}
echo "== Rust GPU tests (each alone, 60 s limit)"
for t in "$GPU_TESTS"/*; do
  [ -f "$t" ] && [ -x "$t" ] || continue
  case $(basename "$t") in *multi_gpu*) continue ;; esac
  tp=$pass
  tf=$fail
  for name in $("$t" --list 2>/dev/null | grep ": test$" | sed 's/: test$//'); do
    out=$(FERRITE_REQUIRE_GPU=1 timeout 60 "$t" --exact "$name" --test-threads=1 --nocapture 2>&1)
    rc=$?
    echo "$out" >>"$LOG"
    echo "$out" | grep -oE "(ping-pong|chain|gated|latency|fault reported): .*" || true
    if [ $rc -eq 0 ] && echo "$out" | grep -q "1 passed" && ! echo "$out" | grep -q "SKIPPED"; then
      ok
      echo "ok   $(basename "$t")::$name"
    else
      bad "$(basename "$t")::$name (rc $rc): $(echo "$out" | grep -E "panicked|SKIPPED|Error|error" | head -3)"
    fi
  done
  # Per test executable (cts: the HAL conformance suite's count on cuda).
  echo "$(basename "$t"): $((pass - tp)) passed, $((fail - tf)) failed"
done

echo "== CPU/GPU differential"
# The parameter file of tests/cuda/params.mlir (@PARAMS@ in cases.txt):
# model.w[i] = 1 + 0.5 * (i % 7), model.b[i] = 0.25 * (i % 5), 2^20 f32
# each, as safetensors (python3's standard library only).
PARAMS=${TMPDIR:-/tmp}/ferrite-cuda-params.safetensors
python3 - "$PARAMS" <<'PY' || echo "could not write $PARAMS"
import array, json, struct, sys
n = 1 << 20
w = array.array("f", [1 + 0.5 * (i % 7) for i in range(n)])
b = array.array("f", [0.25 * (i % 5) for i in range(n)])
h = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]},
                "b": {"dtype": "F32", "shape": [n], "data_offsets": [4 * n, 8 * n]}}).encode()
h += b" " * (-len(h) % 8)
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + w.tobytes() + b.tobytes())
PY
while read -r module fn args; do
  case $module in '' | '#'*) continue ;; esac
  args=${args//@PARAMS@/$PARAMS}
  m=${module/\//_}
  # shellcheck disable=SC2086
  gpu=$("$FERRITE" run-module --device=cuda --module="$DIFF_DIR/$m.cuda.vmfb" --function="$fn" $args 2>&1)
  # shellcheck disable=SC2086
  cpu=$("$FERRITE" run-module --device=local-task --module="$DIFF_DIR/$m.cpu.vmfb" --function="$fn" $args 2>&1)
  if [ "$gpu" = "$cpu" ] && echo "$gpu" | grep -q "^result"; then ok; else
    bad "$module $fn: cuda and local-task differ"
    echo "  cuda:       $(echo "$gpu" | head -c 300)"
    echo "  local-task: $(echo "$cpu" | head -c 300)"
  fi
  if [ -n "$UPSTREAM_BIN" ]; then
    # shellcheck disable=SC2086
    up=$("$UPSTREAM_BIN/iree-run-module" --device=cuda --module="$DIFF_DIR/$m.cuda.vmfb" --function="$fn" $args 2>&1)
    if [ "$(echo "$up" | grep -v '^EXEC')" = "$(echo "$gpu" | grep -v '^EXEC')" ]; then ok; else
      bad "$module $fn: ferrite and upstream differ on cuda"
      echo "  upstream: $(echo "$up" | head -c 300)"
    fi
  fi
done <"$DIFF_DIR/cases.txt"
echo "after differential: $pass passed, $fail failed"

if [ -n "$CHECK_DIR" ] && [ -d "$CHECK_DIR" ]; then
  echo "== check programs (tests/cuda/checks), in one process each, on cuda and local-task"
  for m in "$CHECK_DIR"/*.cuda.vmfb; do
    [ -e "$m" ] || continue
    n=$(basename "$m" .cuda.vmfb)
    for dev in cuda local-task; do
      mod=$m
      [ $dev = cuda ] || mod=$CHECK_DIR/$n.cpu.vmfb
      if out=$(timeout 120 "$FERRITE" check-module --device=$dev --module="$mod" 2>&1); then
        ok
        echo "ok   $n on $dev: $(echo "$out" | tail -1)"
      else
        bad "$n on $dev: $(echo "$out" | grep -E "FAILED|differs|Error|error" | head -4)"
      fi
    done
  done
fi

echo "== MiniLM on cuda against local-task (max |diff| <= 1e-6)"
MINILM_DIR=${MINILM_DIR:-$ROOT/examples/minilm}
W=${MINILM_WEIGHTS:-}
if [ -z "$W" ]; then
  W=${TMPDIR:-/tmp}/minilm-random.safetensors
  python3 -c "import sys; sys.path.insert(0, '$MINILM_DIR'); import model; model.write_random_safetensors('$W')" || W=
fi
if [ -n "$W" ] && [ -f "$MINILM_DIR/minilm_cuda.vmfb" ]; then
  MA="--function=embed --parameters=model=$W --input=1x128xi64=1 --input=1x128xi64=1"
  T=${TMPDIR:-/tmp}
  # shellcheck disable=SC2086
  "$FERRITE" run-module --device=local-task --module="$MINILM_DIR/minilm.vmfb" $MA --output=@"$T/minilm_cpu.npy" >/dev/null 2>&1
  # shellcheck disable=SC2086
  "$FERRITE" run-module --device=cuda --module="$MINILM_DIR/minilm_cuda.vmfb" $MA --output=@"$T/minilm_cuda.npy" >/dev/null 2>&1
  d=$(python3 -c "import numpy as np; print(float(np.max(np.abs(np.load('$T/minilm_cuda.npy').astype('f8') - np.load('$T/minilm_cpu.npy')))))" 2>&1)
  if python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) <= 1e-6 else 1)" "$d" 2>/dev/null; then
    ok
    echo "ok   minilm cuda vs local-task: max |diff| $d"
  else
    bad "minilm cuda vs local-task: max |diff| $d"
    # Where it parts, dispatch by dispatch (serialized: may well agree,
    # which points at ordering between submissions).
    # shellcheck disable=SC2086
    "$FERRITE" run-module --device=cuda --compare_device=local-task --module="$MINILM_DIR/minilm_cuda.vmfb" \
      --compare_module="$MINILM_DIR/minilm.vmfb" $MA 2>&1 | grep -E "dispatch comparison|FIRST|binding" | head -6
  fi
else
  echo "SKIPPED minilm (no weights: numpy missing)"
fi

echo "== kernel times (FERRITE_CUDA_KERNEL_TIMES=1)"
read -r module fn args < <(grep -v '^#' "$DIFF_DIR/cases.txt" | grep . | head -1)
m=${module/\//_}
# shellcheck disable=SC2086
kt=$(FERRITE_CUDA_KERNEL_TIMES=1 "$FERRITE" run-module --device=cuda --module="$DIFF_DIR/$m.cuda.vmfb" --function="$fn" $args 2>&1)
if echo "$kt" | grep -qE "kernel times .*: [1-9][0-9]* launches" && echo "$kt" | grep -qE "^  [^ ].* [0-9.]+%$" && echo "$kt" | grep -q "^result"; then
  ok
  echo "ok   $module $fn: $(echo "$kt" | grep "kernel times" | head -c 200)"
else
  bad "kernel times on $module $fn: $(echo "$kt" | head -c 400)"
fi

echo "== profile bundle on cuda (upstream's iree-profile, iree-profile-render)"
# tests/trace/two_matmuls.mlir on cuda with every family Ferrite records:
# the device-timestamped dispatch events in the bundle are the kernels the
# driver launched (FERRITE_CUDA_KERNEL_TIMES counts them independently),
# each matched to its command, with a device duration, in stream order,
# with clock samples; the queue operations are device queue events with
# device durations (device-queue-events); the device's block pool shows
# in the memory events (fresh blocks, reservations joined to allocations);
# and the bundle renders to Perfetto.
PROF_MODULE=$DIFF_DIR/trace_two_matmuls.cuda.vmfb
if [ -z "$UPSTREAM_BIN" ] || [ ! -x "$UPSTREAM_BIN/iree-profile" ]; then
  echo "SKIPPED profile bundle (no upstream iree-profile: UPSTREAM_BIN unset)"
elif [ ! -f "$PROF_MODULE" ]; then
  bad "profile bundle: $PROF_MODULE missing (scripts/gpu-build.sh builds it)"
else
  T=${TMPDIR:-/tmp}/ferrite-cuda-profile
  rm -rf "$T" && mkdir -p "$T"
  run=$(FERRITE_CUDA_KERNEL_TIMES=1 "$FERRITE" run-module --device=cuda --module="$PROF_MODULE" \
    --function=two_matmuls --input=32x64xf32=1 --input=64x16xf32=1 --input=16x8xf32=1 \
    --device_profiling_mode=queue-events,host-execution,device-queue-events,dispatch-events,memory-events \
    --device_profiling_output="$T/cuda.ireeprof" --trace="$T/cuda.json" 2>&1)
  launches=$(echo "$run" | grep -oE "kernel times .*: [0-9]+ launches" | grep -oE "[0-9]+ launches" | cut -d' ' -f1)
  summary=$("$UPSTREAM_BIN/iree-profile" summary "$T/cuda.ireeprof" 2>&1)
  dispatch=$("$UPSTREAM_BIN/iree-profile" dispatch "$T/cuda.ireeprof" 2>&1)
  command=$("$UPSTREAM_BIN/iree-profile" command "$T/cuda.ireeprof" 2>&1)
  queue=$("$UPSTREAM_BIN/iree-profile" queue "$T/cuda.ireeprof" 2>&1)
  memory=$("$UPSTREAM_BIN/iree-profile" memory "$T/cuda.ireeprof" 2>&1)
  "$UPSTREAM_BIN/iree-profile" export --format=ireeperf-jsonl --output="$T/cuda.jsonl" "$T/cuda.ireeprof" >/dev/null 2>&1
  if verdict=$(python3 - "$T/cuda.jsonl" "${launches:-missing}" "$summary" "$dispatch" "$command" "$queue" "$memory" "$T/cuda.json" <<'PY' 2>&1
import json, re, sys
jsonl, launches, summary, dispatch, command, queue, memory, trace = sys.argv[1:]
def field(text, start, key):
    line = next(l for l in text.splitlines() if l.strip().startswith(start))
    return re.search(r"\b" + key + r"=(\S+)", line).group(1)
problems = []
def want(ok, what):
    if not ok:
        problems.append(what)
want(field(summary, "records:", "session_end") == "1", "no session end")
want(field(summary, "records:", "unknown") == "0", "unknown records")
want(field(summary, "event_records:", "invalid_host_execution_events") == "0", "invalid events")
total = field(dispatch, "dispatches:", "total")
want(launches.isdigit() and int(launches) > 0, f"kernel launches not counted ({launches})")
want(total == launches, f"{total} device dispatches in the bundle, {launches} kernels launched")
want(field(dispatch, "dispatches:", "valid") == total, "invalid dispatches")
want(field(dispatch, "host_dispatches:", "total") == "0", "dispatches as host events")
want(field(command, "command_buffers=", "matched_dispatches") == total, "dispatches not matched to commands")
samples = re.search(r"clock_samples=(\d+)", summary)
want(samples is not None and int(samples.group(1)) >= 1, "no clock samples")
for export in ("two_matmuls_dispatch_0", "two_matmuls_dispatch_1"):
    want(export in dispatch, f"{export} missing")
want("type=execute" in queue, "no execute in the queue events")
device_queue = int(field(summary, "event_records:", "queue_device_events"))
want(device_queue > 0, "no device queue events")
device_lines = [l.strip() for l in queue.splitlines() if l.strip().startswith("device_event=")]
want(len(device_lines) == device_queue, f"{len(device_lines)} device_event lines, {device_queue} records")
want(any(" type=execute " in l for l in device_lines), "no execute among the device queue events")
for l in device_lines:
    want(" valid=true" in l and " ns=" in l, f"device queue event without a device duration: {l}")
want(re.search(r"queue_alloca/dealloca=[1-9]", memory) is not None, "no queue allocations")
pool = re.search(r"slab_acquire/release=(\d+)/(\d+) pool_reserve/materialize/release/wait=(\d+)/(\d+)/(\d+)/\d+", memory)
want(pool is not None, "no pool counts in iree-profile memory")
if pool:
    acquired, _, reserved, materialized, released = (int(g) for g in pool.groups())
    want(acquired >= 1, "no fresh pool block (slab acquire)")
    want(reserved >= 1 and reserved == materialized, f"pool reserve/materialize {reserved}/{materialized}")
    want(released >= 1, "no pool release")
events = [json.loads(l) for l in open(jsonl)]
ds = [e for e in events if e.get("record_type") == "dispatch_event"]
want(len(ds) == int(total), f"{len(ds)} dispatch events exported")
for a, b in zip(ds, ds[1:]):
    want(a["end_tick"] <= b["start_tick"], f"dispatches overlap on one stream: {a} {b}")
for d in ds:
    want(d["valid"] and d["duration_ticks"] > 0, f"dispatch without device time: {d}")
json.load(open(trace))
if problems:
    print("; ".join(problems))
    sys.exit(1)
print(f"{total} device dispatches = {launches} launches, {samples.group(1)} clock samples, "
      + f"{device_queue} device queue events, pool {pool.group(0) if pool else '-'}, device times "
      + ", ".join(str(d["duration_ticks"]) + " ns" for d in ds))
PY
  ); then
    ok
    echo "ok   profile bundle on cuda: $verdict"
  else
    bad "profile bundle on cuda: $verdict $(echo "$run" | grep -iE "error" | head -3)"
  fi
  if [ -n "${UPSTREAM_PYTHONPATH:-}" ] && rendered=$(PYTHONPATH=$UPSTREAM_PYTHONPATH python3 -m iree._runtime.scripts.iree_profile_render \
    --format=perfetto -o "$T/cuda.pftrace" "$T/cuda.jsonl" 2>&1) && [ -s "$T/cuda.pftrace" ]; then
    ok
    echo "ok   profile bundle on cuda renders to Perfetto: $(echo "$rendered" | tail -1 | head -c 200)"
  else
    bad "profile bundle on cuda: iree-profile-render failed: $(echo "${rendered:-UPSTREAM_PYTHONPATH unset}" | tail -3)"
  fi
fi
fi

if [ -n "$E2E_DIR" ] && [ -d "$E2E_DIR" ]; then
  echo "== upstream e2e suites on cuda, per function next to upstream's cuda driver"
  # Fails on any function upstream passes that Ferrite does not (every
  # Ferrite failure without UPSTREAM_PYTHONPATH); one count each way.
  up=()
  [ -n "${UPSTREAM_PYTHONPATH:-}" ] && up=(--upstream-pythonpath "$UPSTREAM_PYTHONPATH")
  out=$(python3 "$ROOT/scripts/gpu-e2e-check.py" --ferrite "$FERRITE" --e2e-dir "$E2E_DIR" \
    "${up[@]}" --log "$LOG")
  echo "$out"
  counts=$(echo "$out" | grep -E '^gpu-e2e: [0-9]+ passed, [0-9]+ regressions$' | tail -1)
  if [ -z "$counts" ]; then
    bad "upstream e2e on cuda: no result"
  else
    pass=$((pass + $(echo "$counts" | awk '{print $2}')))
    fail=$((fail + $(echo "$counts" | awk '{print $4}')))
  fi
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
