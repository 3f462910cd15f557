#!/usr/bin/env bash
# Upstream IREE's e2e check programs (its tests/e2e suites) under Ferrite on
# the CPU devices, compared function by function with upstream's own verdicts.
# CI runs this (scripts/test.sh); scripts/upstream-e2e.sh is the hand-run
# script over a git mirror (every suite, generated runner tests, cuda).
#
#   scripts/upstream-e2e-check.sh [--list]
#
# Sources come from a directory of test data, never from the repository:
# UPSTREAM_E2E (default ../shared/upstream-e2e beside the repository) holds
# upstream's tests/e2e tree and expected-llvm-cpu.tsv (suite, file, function,
# upstream's llvm-cpu verdict `pass` or `skip`). Every file with a function
# upstream passes is compiled with the pinned iree-compile and the flags of
# each llvm-cpu check suite of its CMakeLists.txt that lists it (see
# scripts/upstream_e2e_suites.py), and run with `ferrite check-module` on
# every device in the default module mode. Exit status 1 when any function
# upstream passes fails, or does not run, on any device; functions upstream
# skips are counted but never fail the run.
#
# Compiled modules are cached in build/upstream-e2e-cache/ under a hash of
# (compiler version, flags, source), so reruns only run.
#
# A function check-module skips for its signature (it takes arguments or
# returns values: upstream's lit tests, which run it with iree-run-mlir and
# FileCheck its output) is run with `ferrite run-module` and the inputs of its
# llvm-cpu RUN line, and passes when upstream's iree-run-module gives the same
# output for the same module, device and inputs.
#
# Environment: UPSTREAM_E2E (test data), IREE_COMPILE (default
# .venv/bin/iree-compile), REFERENCE (upstream's runner, default
# .venv/bin/iree-run-module), FERRITE (default target/debug/ferrite), DEVICES
# (default "local-sync local-task"), JOBS (parallel compiles, default 2),
# RUN_TIMEOUT (seconds per check-module run, default 300), COMPILE_TIMEOUT
# (seconds per compile, default 900), E2E_ALL=1 (also compile the files whose
# every function upstream skips), E2E_CACHE (default build/upstream-e2e-cache),
# E2E_OUT (logs, default build/upstream-e2e-check).
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
UPSTREAM_E2E=${UPSTREAM_E2E:-$ROOT/../shared/upstream-e2e}
IREE_COMPILE=${IREE_COMPILE:-$ROOT/.venv/bin/iree-compile}
REFERENCE=${REFERENCE:-$ROOT/.venv/bin/iree-run-module}
FERRITE=${FERRITE:-$ROOT/target/debug/ferrite}
DEVICES=${DEVICES:-local-sync local-task}
JOBS=${JOBS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
COMPILE_TIMEOUT=${COMPILE_TIMEOUT:-900}
CACHE=${E2E_CACHE:-$ROOT/build/upstream-e2e-cache}
OUT=${E2E_OUT:-$ROOT/build/upstream-e2e-check}
HELPER=$ROOT/scripts/upstream_e2e_suites.py
TSV=$UPSTREAM_E2E/expected-llvm-cpu.tsv

if [[ ! -f "$TSV" || ! -d "$UPSTREAM_E2E/tests/e2e" ]]; then
  echo "upstream-e2e-check: no upstream e2e test data at $UPSTREAM_E2E" \
    "(expected tests/e2e/ and expected-llvm-cpu.tsv; set UPSTREAM_E2E)" >&2
  exit 2
fi
for tool in "$IREE_COMPILE" "$REFERENCE"; do
  [[ -x "$tool" ]] || { echo "upstream-e2e-check: no $tool (scripts/setup-venv.sh)" >&2; exit 2; }
done
if [[ "${1:-}" != --list ]]; then
  [[ -x "$FERRITE" ]] || { echo "upstream-e2e-check: no ferrite at $FERRITE (cargo build -p ferrite-cli)" >&2; exit 2; }
fi

rm -rf "$OUT"
mkdir -p "$OUT" "$CACHE"
"$IREE_COMPILE" --version >"$OUT/compiler-id" 2>&1 || { echo "upstream-e2e-check: $IREE_COMPILE --version failed" >&2; exit 2; }
all=()
[[ "${E2E_ALL:-0}" == 1 ]] && all=(--all)
python3 "$HELPER" plan --root "$UPSTREAM_E2E" --tsv "$TSV" --out "$OUT" \
  --compiler-id "$OUT/compiler-id" "${all[@]}" >"$OUT/plan.txt" || exit 2
grep -v -E '^(#|SKIPPED )' "$OUT/plan.txt" >"$OUT/jobs.tsv"
grep '^SKIPPED ' "$OUT/plan.txt"
grep '^#' "$OUT/plan.txt" | sed 's/^# /  note: /'
njobs=$(wc -l <"$OUT/jobs.tsv")
echo "upstream-e2e-check: $njobs modules from $(cd "$UPSTREAM_E2E" && pwd)" \
  "($(grep -m1 -o 'compiler version [^ ]*' "$OUT/compiler-id"))"
if [[ "${1:-}" == --list ]]; then
  awk -F'\t' '{ print "  " $1 "/" $2 "  [" $3 "]  " $7 }' "$OUT/jobs.tsv"
  exit 0
fi

# Compile what the cache lacks, $JOBS at a time. A compiler error is cached
# too (<key>.failed with its log), as the same inputs fail the same way.
t0=$(date +%s)
export IREE_COMPILE CACHE COMPILE_TIMEOUT
awk -F'\t' '{ print $4 "\t" $5 "\t" $6 "\t" $7 }' "$OUT/jobs.tsv" | sort -t$'\t' -k2,2 -u \
  | while IFS=$'\t' read -r src key logbase flags; do
      [[ -f "$CACHE/$key.vmfb" || -f "$CACHE/$key.failed" ]] || printf '%s\t%s\t%s\n' "$src" "$key" "$flags"
    done >"$OUT/to-compile.tsv"
ncompile=$(wc -l <"$OUT/to-compile.tsv")
echo "upstream-e2e-check: compiling $ncompile module(s) ($((njobs - ncompile)) cached), $JOBS at a time"
tr '\n' '\0' <"$OUT/to-compile.tsv" | xargs -0 -r -P "$JOBS" -I{} bash -c '
  IFS=$'"'"'\t'"'"' read -r src key flags <<<"$1"
  read -r -a fl <<<"$flags"
  tmp=$CACHE/$key.tmp.$$
  if timeout "$COMPILE_TIMEOUT" "$IREE_COMPILE" "${fl[@]}" "$src" -o "$tmp" >"$CACHE/$key.log" 2>&1; then
    mv "$tmp" "$CACHE/$key.vmfb"
  else
    rc=$?
    rm -f "$tmp"
    echo "### exit $rc" >>"$CACHE/$key.log"
    # A compiler error is cached; a timeout or a kill is not.
    [[ $rc -eq 1 ]] && mv "$CACHE/$key.log" "$CACHE/$key.failed"
    why=$(grep -m1 -o "error: .*" "$CACHE/$key".{failed,log} 2>/dev/null | head -1 | cut -d: -f2- | cut -c1-160)
    [[ $rc -eq 124 ]] && why="timed out after $COMPILE_TIMEOUT s"
    echo "  compile failed (exit $rc): $src ($why)"
  fi' _ {}
t1=$(date +%s)
echo "upstream-e2e-check: compiled in $((t1 - t0)) s"

# Run every module on every device.
while IFS=$'\t' read -r suite file variant src key logbase flags; do
  mkdir -p "$(dirname "$logbase")"
  if [[ ! -f "$CACHE/$key.vmfb" ]]; then
    cat "$CACHE/$key.failed" "$CACHE/$key.log" >"$logbase.compile.log" 2>/dev/null
    why=$(grep -m1 -o 'error: .*' "$logbase.compile.log" | cut -c1-160)
    echo "  not compiled  $suite/$file [$variant]: ${why:-$(tail -1 "$logbase.compile.log")}"
    continue
  fi
  line="  ran  $suite/$file [$variant]"
  for dev in $DEVICES; do
    log=$logbase.$dev.log
    timeout "$RUN_TIMEOUT" "$FERRITE" check-module --module="$CACHE/$key.vmfb" --device="$dev" >"$log" 2>&1 </dev/null
    rc=$?
    echo "### exit $rc" >>"$log"
    # Functions check-module skips for their signature (upstream runs them
    # as lit tests): run-module with the RUN line's inputs, against upstream.
    if grep -q '^\[ *SKIPPED *\] .*(signature' "$log"; then
      python3 "$HELPER" lit --log "$log" --module "$CACHE/$key.vmfb" --device "$dev" --src "$src" \
        --ferrite "$FERRITE run-module" --reference "$REFERENCE" --timeout "$RUN_TIMEOUT"
    fi
    line+="  $dev: $(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$log" | tail -1 || true)"
    [[ $rc -ne 0 ]] && line+=" (exit $rc)"
  done
  echo "$line"
done <"$OUT/jobs.tsv"
t2=$(date +%s)
echo "upstream-e2e-check: ran in $((t2 - t1)) s"
echo
python3 "$HELPER" report --tsv "$TSV" --jobs "$OUT/jobs.tsv" --devices "$DEVICES" \
  --cache "$CACHE" --python "${PYTHON:-$ROOT/.venv/bin/python}"
