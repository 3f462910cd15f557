#!/usr/bin/env bash
# Checks that an opcode added to the VM ISA cannot be silently skipped: adds
# a made-up op (a copy of add.i32 under a new name and a free core opcode
# byte) to a copy of isa.json, regenerates isa.rs with scripts/gen-isa.py in
# a scratch copy of the committed tree (git archive HEAD), runs
# `cargo check -p ferrite-vm` there, and requires exactly the three
# "non-exhaustive patterns" errors that force a decision about the new op:
# the interpreter's dispatch, the compiling tier's allow-list and its
# translator. The decoder, verifier and disassembler take the op from the
# generated tables and must compile unchanged.
#
# Usage: scripts/check-new-op.sh [path/to/isa.json]
#   (default: $FERRITE_ISA_JSON, else ../shared/isa.json beside the repository)
# Environment: CARGO_TARGET_DIR (default: a target dir inside the scratch copy)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ISA_JSON="${1:-${FERRITE_ISA_JSON:-$ROOT/../shared/isa.json}}"
[[ -f "$ISA_JSON" ]] || { echo "check-new-op: no isa.json at $ISA_JSON" >&2; exit 2; }
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
git -C "$ROOT" archive HEAD | tar -x -C "$WORK"
python3 - "$ISA_JSON" "$WORK/isa.json" <<'PY'
import json, sys
isa = json.load(open(sys.argv[1]))
ins = isa["instructions"]
src = next(i for i in ins if i.get("symbol") == "AddI32")
used = {i["opcode"] for i in ins if i.get("opcode_set") == "core" and "opcode" in i}
new = dict(src, symbol="ProbeNewOp", mnemonic="probe.new.op",
           opcode=next(b for b in range(256) if b not in used))
ins.append(new)
json.dump(isa, open(sys.argv[2], "w"))
PY
python3 "$WORK/scripts/gen-isa.py" "$WORK/isa.json" | rustfmt --edition 2021 --emit stdout \
  > "$WORK/crates/ferrite-vm/src/bytecode/isa.rs"
grep -q ProbeNewOp "$WORK/crates/ferrite-vm/src/bytecode/isa.rs"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$WORK/target}"
if (cd "$WORK" && cargo check -q -p ferrite-vm) >"$WORK/check.log" 2>&1; then
  echo "check-new-op: FAILED: ferrite-vm compiled with an op nobody handles" >&2
  exit 1
fi
# The files whose `match` names the op as not covered.
# (The interpreter matches the decoded op with its typed registers,
# `OpRegs::ProbeNewOp(..)`; the tier matches `Op::ProbeNewOp`.)
mapfile -t where < <(grep -E -A1 "non-exhaustive patterns: \`(Op|OpRegs)::ProbeNewOp(\(.*\))?\` not covered" "$WORK/check.log" \
  | sed -n 's/^ *--> *\([^:]*\):.*/\1/p' | sort)
expected=(crates/ferrite-vm/src/bytecode/interp/dispatch.rs
  crates/ferrite-vm/src/bytecode/jit/allow.rs
  crates/ferrite-vm/src/bytecode/jit/translate.rs)
errors=$(grep -c '^error\[' "$WORK/check.log" || true)
if [[ "${where[*]}" != "${expected[*]}" || "$errors" != 3 ]]; then
  echo "check-new-op: FAILED: expected exactly the 3 non-exhaustive matches in ${expected[*]}; got $errors errors:" >&2
  grep -E '^error|-->' "$WORK/check.log" >&2
  exit 1
fi
echo "check-new-op: a new op is a compile error in ${expected[*]}, nowhere else"
