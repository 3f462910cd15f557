#!/usr/bin/env bash
# Runs upstream IREE's own VM test programs (runtime/src/iree/vm/test/*.vmasm)
# through a runner. Nothing of upstream is committed here: the sources are read
# at test time from a directory of test data (UPSTREAM_VM_TESTS, default
# ../shared/upstream-vm-tests beside the repository; CI uses this) or, with
# IREE_MIRROR set and UPSTREAM_VM_TESTS not, extracted from a git mirror of
# iree-org/iree; either way they are copied into build/upstream-vm/ (ignored)
# and assembled with the pinned iree-as-module.
#
#   test_*  must exit 0.
#   fail_*  must fail after "EXEC @<fn>", and its error must match what upstream
#           iree-run-module prints for the same function: the status code
#           always; the message too when the error comes from vm.fail (upstream
#           prints it as "<vm>:0: CODE; message; ..."), or for every error when
#           MESSAGES=strict. Errors that upstream raises from its C sources
#           (e.g. "list.c:695: OUT_OF_RANGE; index 3 out of bounds (3)") are
#           compared by code only by default, with any message difference shown.
#
# async_ops.vmasm imports the native test module `yieldable_test`; the runner
# is given --yieldable-test-module for that file only. Upstream's
# iree-run-module has no such module, so those functions have no reference.
#
# Environment:
#   UPSTREAM_VM_TESTS  directory holding the *.vmasm files (default
#                ../shared/upstream-vm-tests); wins over IREE_MIRROR
#   IREE_MIRROR  clone or bare git mirror of iree-org/iree, read when
#                UPSTREAM_VM_TESTS is not set
#   RUNNER       runner under test (default: target/release/ferrite run-module)
#   REFERENCE    upstream runner giving reference errors
#                (default: .venv/bin/iree-run-module)
#   MESSAGES     "vm" (default) or "strict", see above
#   SKIP         space-separated program names to leave out (e.g. SKIP=async_ops
#                when RUNNER is upstream's iree-run-module, which lacks the flag)
#   TIMEOUT      seconds per function (default 30)
#   VERBOSE=1    print every function
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# Source: a directory of test data, or a git mirror (see above).
if [[ -n "${UPSTREAM_VM_TESTS:-}" || -z "${IREE_MIRROR:-}" ]]; then
  SRC_DIR="${UPSTREAM_VM_TESTS:-$ROOT/../shared/upstream-vm-tests}"
  MIRROR=""
else
  SRC_DIR=""
  MIRROR="$IREE_MIRROR"
fi
RUNNER="${RUNNER:-target/release/ferrite run-module}"
REFERENCE="${REFERENCE:-.venv/bin/iree-run-module}"
AS_MODULE="${AS_MODULE:-.venv/bin/iree-as-module}"
DUMP="${DUMP:-.venv/bin/iree-dump-module}"
MESSAGES="${MESSAGES:-vm}"
TIMEOUT="${TIMEOUT:-30}"
OUT="build/upstream-vm"
TEST_DIR="runtime/src/iree/vm/test"
read -r -a runner_cmd <<<"$RUNNER"
read -r -a reference_cmd <<<"$REFERENCE"

if [[ -n "$SRC_DIR" ]]; then
  if [[ ! -d "$SRC_DIR" ]]; then
    echo "upstream-vm-suite: no upstream VM test programs at $SRC_DIR" \
      "(set UPSTREAM_VM_TESTS to a directory of *.vmasm, or IREE_MIRROR to a git mirror of iree-org/iree)" >&2
    exit 2
  fi
elif ! git -C "$MIRROR" rev-parse --verify -q HEAD >/dev/null; then
  echo "upstream-vm-suite: no git mirror at $MIRROR (set IREE_MIRROR)" >&2
  exit 2
fi
if ! command -v "${runner_cmd[0]}" >/dev/null 2>&1 && [[ ! -x "${runner_cmd[0]}" ]]; then
  echo "upstream-vm-suite: runner '${runner_cmd[0]}' not found (cargo build --release?)" >&2
  exit 2
fi
for tool in "$AS_MODULE" "$DUMP" "${reference_cmd[0]}"; do
  [[ -x "$tool" ]] || { echo "upstream-vm-suite: missing $tool (run scripts/setup-venv.sh)" >&2; exit 2; }
done

rm -rf "$OUT"
mkdir -p "$OUT/src"
if [[ -n "$SRC_DIR" ]]; then
  mapfile -t sources < <(cd "$SRC_DIR" && ls -1 -- *.vmasm 2>/dev/null)
  origin="$SRC_DIR"
else
  mapfile -t sources < <(git -C "$MIRROR" ls-tree --name-only HEAD "$TEST_DIR/" | grep '\.vmasm$')
  origin="$MIRROR @ $(git -C "$MIRROR" rev-parse --short HEAD)"
fi
if [[ ${#sources[@]} -eq 0 ]]; then
  echo "upstream-vm-suite: no *.vmasm in ${SRC_DIR:-$TEST_DIR of the mirror}" >&2
  exit 2
fi
echo "upstream-vm-suite: ${#sources[@]} programs from $origin"
echo "  runner:    $RUNNER"
echo "  reference: $REFERENCE"

# "CODE; message" from the first status line of a run's output, e.g.
#   "<vm>:0: DEADLINE_EXCEEDED; error!; ; invoking function 'fail_always'"
#   -> "DEADLINE_EXCEEDED; error!"
status_of() {
  grep -m1 -oE '\b[A-Z][A-Z_]+; .*' <<<"$1" | awk -F'; ' '{ print $1 "; " $2 }'
}
list_exports() {
  "$DUMP" --output=metadata "$1" | awk '
    /^Exported Functions:/ { on = 1; next }
    on && /^[[:space:]]*$/ { exit }
    on { sub(/^[[:space:]]*\[[[:space:]]*[0-9]+\][[:space:]]*/, ""); sub(/\(.*/, ""); print }'
}

t_pass=0; t_fail_ok=0; t_bad=0; t_noasm=0; t_msgdiff=0
for path in "${sources[@]}"; do
  name="$(basename "$path" .vmasm)"
  if [[ " ${SKIP:-} " == *" $name "* ]]; then echo "$name: skipped (SKIP)"; continue; fi
  src="$OUT/src/$name.vmasm"
  vmfb="$OUT/$name.vmfb"
  if [[ -n "$SRC_DIR" ]]; then
    cp "$SRC_DIR/$path" "$src"
  else
    git -C "$MIRROR" show "HEAD:$path" >"$src"
  fi
  if ! asm_err="$("$AS_MODULE" --output="$vmfb" "$src" 2>&1)"; then
    echo "$name: NOT ASSEMBLED by the pinned iree-as-module: $asm_err"
    t_noasm=$((t_noasm + 1))
    continue
  fi
  extra=()
  [[ "$name" == async_ops ]] && extra=(--yieldable-test-module)
  p=0; f=0; b=0
  while IFS= read -r fn; do
    case "$fn" in test_*) want=pass ;; fail_*) want=fail ;; *) continue ;; esac
    out="$(timeout "$TIMEOUT" "${runner_cmd[@]}" "${extra[@]}" --module="$vmfb" --function="$fn" 2>&1)"
    rc=$?
    if [[ $want == pass ]]; then
      if [[ $rc -eq 0 ]]; then
        p=$((p + 1)); [[ "${VERBOSE:-0}" == 1 ]] && echo "  ok   $name.$fn"
      else
        b=$((b + 1)); echo "  FAIL $name.$fn: expected success, rc=$rc"
        sed 's/^/       | /' <<<"$out" | tail -n 6
      fi
      continue
    fi
    # fail_*: must fail at run time.
    if [[ $rc -eq 0 || $rc -eq 124 ]] || ! grep -q "^EXEC @$fn\$" <<<"$out"; then
      b=$((b + 1)); echo "  FAIL $name.$fn: expected a runtime failure, rc=$rc"
      sed 's/^/       | /' <<<"$out" | tail -n 6
      continue
    fi
    got="$(status_of "$out")"
    if [[ ${#extra[@]} -gt 0 ]]; then
      f=$((f + 1)); [[ "${VERBOSE:-0}" == 1 ]] && echo "  fail $name.$fn: $got (no upstream reference)"
      continue
    fi
    ref_out="$(timeout "$TIMEOUT" "${reference_cmd[@]}" --module="$vmfb" --function="$fn" 2>&1)"
    ref="$(status_of "$ref_out")"
    ref_line="$(grep -m1 -E '\b[A-Z][A-Z_]+; ' <<<"$ref_out")"
    if [[ -z "$ref" ]]; then
      f=$((f + 1)); echo "  note $name.$fn: upstream printed no status line; got '$got'"
    elif [[ "${got%%;*}" != "${ref%%;*}" ]]; then
      b=$((b + 1)); echo "  FAIL $name.$fn: status '$got', upstream '$ref'"
    elif [[ "$got" == "$ref" ]]; then
      f=$((f + 1)); [[ "${VERBOSE:-0}" == 1 ]] && echo "  fail $name.$fn: $got (matches upstream)"
    elif [[ "$MESSAGES" == strict || "$ref_line" == *"<vm>:"* ]]; then
      b=$((b + 1)); echo "  FAIL $name.$fn: message '$got', upstream '$ref'"
    else
      f=$((f + 1)); t_msgdiff=$((t_msgdiff + 1))
      echo "  note $name.$fn: same code, message differs: '$got' vs upstream '$ref'"
    fi
  done < <(list_exports "$vmfb")
  printf '%-24s %3d passed, %3d failed-as-expected, %3d unexpected\n' "$name" "$p" "$f" "$b"
  t_pass=$((t_pass + p)); t_fail_ok=$((t_fail_ok + f)); t_bad=$((t_bad + b))
done
echo "upstream-vm-suite: $t_pass passed, $t_fail_ok failed-as-expected ($t_msgdiff with other wording), $t_bad unexpected, $t_noasm programs not assembled"
[[ $t_bad -eq 0 && $t_noasm -eq 0 ]]
