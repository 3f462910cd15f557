#!/usr/bin/env bash
# Runs every exported test_*/fail_* function of every fixture under
# build/fixtures/vm through a runner and checks the outcome:
#   test_*  must exit 0,
#   fail_*  must exit non-zero after the runner printed "EXEC @<fn>" (a runtime
#           error, not a load error). A death by signal (e.g. SIGFPE from an
#           integer division by zero in upstream's C interpreter) counts as a
#           failure; Ferrite is expected to report a clean error instead.
# Other exports (functions taking arguments, for differential runs) are skipped.
#
# Environment:
#   RUNNER    command taking --module=... --function=...
#             (default: .venv/bin/iree-run-module; e.g.
#              RUNNER="target/release/ferrite run-module")
#   LABEL     name printed in the summary (default: upstream, or the runner)
#   DUMP      iree-dump-module used to list exports (default: .venv/bin/iree-dump-module)
#   FIXTURES  space-separated fixture names to run (default: all)
#   SKIP      space-separated fixture names to leave out. Default: "yield" when
#             RUNNER is upstream's (3.13 hangs on any vm.yield), else none.
#   TIMEOUT   seconds per function (default: 60)
#   VERBOSE=1 print every function's result
# Exit status: non-zero if any function behaved unexpectedly.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEFAULT_RUNNER=".venv/bin/iree-run-module"
RUNNER="${RUNNER:-$DEFAULT_RUNNER}"
if [[ -z "${LABEL:-}" ]]; then
  if [[ "$RUNNER" == "$DEFAULT_RUNNER" ]]; then LABEL=upstream; else LABEL="$(basename "${RUNNER%% *}")"; fi
fi
DUMP="${DUMP:-.venv/bin/iree-dump-module}"
TIMEOUT="${TIMEOUT:-60}"
FIX_DIR="build/fixtures/vm"
read -r -a runner_cmd <<<"$RUNNER"

shopt -s nullglob
fixtures=("$FIX_DIR"/*.vmfb)
if [[ ${#fixtures[@]} -eq 0 ]]; then
  echo "check-upstream: no fixtures in $FIX_DIR (run scripts/build-fixtures.sh)" >&2
  exit 2
fi

# Prints the names of the exported functions of a module, one a line.
list_exports() {
  "$DUMP" --output=metadata "$1" | awk '
    /^Exported Functions:/ { on = 1; next }
    on && /^[[:space:]]*$/ { exit }
    on { sub(/^[[:space:]]*\[[[:space:]]*[0-9]+\][[:space:]]*/, ""); sub(/\(.*/, ""); print }'
}

contains() { local x="$1"; shift; for y in "$@"; do [[ "$x" == "$y" ]] && return 0; done; return 1; }
read -r -a only <<<"${FIXTURES:-}"
if [[ -z "${SKIP+x}" && "$RUNNER" == "$DEFAULT_RUNNER" ]]; then
  SKIP="yield"
  echo "note: leaving out fixture 'yield' (upstream 3.13 never completes a vm.yield)"
fi
read -r -a skip <<<"${SKIP:-}"

passed=0; failed_ok=0; unexpected=0; skipped=0
for fx in "${fixtures[@]}"; do
  name="$(basename "$fx" .vmfb)"
  if [[ ${#only[@]} -gt 0 ]] && ! contains "$name" "${only[@]}"; then continue; fi
  if [[ ${#skip[@]} -gt 0 ]] && contains "$name" "${skip[@]}"; then continue; fi
  if ! exports="$(list_exports "$fx")" || [[ -z "$exports" ]]; then
    echo "UNEXPECTED $name: cannot list exports" >&2
    unexpected=$((unexpected + 1)); continue
  fi
  fp=0; ff=0; fu=0
  while IFS= read -r fn; do
    case "$fn" in
      test_*) want=pass ;;
      fail_*) want=fail ;;
      *) skipped=$((skipped + 1)); continue ;;
    esac
    out="$(timeout "$TIMEOUT" "${runner_cmd[@]}" --module="$fx" --function="$fn" 2>&1)"
    rc=$?
    if [[ $want == pass && $rc -eq 0 ]]; then
      fp=$((fp + 1)); [[ "${VERBOSE:-0}" == 1 ]] && echo "  ok   $name.$fn"
    elif [[ $want == fail && $rc -ne 0 && $rc -ne 124 ]] && grep -q "^EXEC @$fn\$" <<<"$out"; then
      # Failed after the function was invoked (a load error prints no EXEC line).
      ff=$((ff + 1))
      if [[ "${VERBOSE:-0}" == 1 ]]; then
        msg="$(grep -m1 -E '[A-Z_]+;' <<<"$out" || true)"
        [[ $rc -ge 128 ]] && msg="abnormal exit (signal?) ${msg}"
        echo "  fail $name.$fn (rc=$rc) ${msg}"
      fi
    else
      fu=$((fu + 1))
      echo "UNEXPECTED $name.$fn: wanted $want, rc=$rc" >&2
      sed 's/^/    | /' <<<"$out" | tail -n 8 >&2
    fi
  done <<<"$exports"
  printf '%-24s %3d passed, %3d failed-as-expected, %3d unexpected\n' "$name" "$fp" "$ff" "$fu"
  passed=$((passed + fp)); failed_ok=$((failed_ok + ff)); unexpected=$((unexpected + fu))
done
echo "$LABEL: $passed passed, $failed_ok failed-as-expected, $unexpected unexpected ($skipped non-test exports skipped)"
[[ $unexpected -eq 0 ]]
