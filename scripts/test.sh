#!/usr/bin/env bash
# Runs every test of the project, installing what it needs first:
#   1. the pinned upstream tools in .venv (fixtures, differential tests),
#   2. our fixture programs compiled with them,
#   3. formatting and lint gates, the Rust test suites,
#   4. upstream's own VM test programs under our runtime (from the upstream
#      source mirror named by IREE_MIRROR).
#
# FERRITE_REQUIRE_UPSTREAM=1 (CI sets it) turns every skip for a missing
# upstream prerequisite (pinned tools, upstream mirror) into a failure; a
# skip is otherwise printed as "SKIPPED <what>: <why>".
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
step() { printf '\n==> %s\n' "$*"; }

step "pinned upstream tools"
scripts/setup-venv.sh
step "fixtures"
scripts/build-fixtures.sh
step "format and lint"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -q -- -D warnings
step "generated ISA tables match shared/isa.json"
ISA_JSON="${FERRITE_ISA_JSON:-$ROOT/../shared/isa.json}"
if [[ -f "$ISA_JSON" ]]; then
  python3 scripts/gen-isa.py "$ISA_JSON" | rustfmt --edition 2021 --emit stdout 2>/dev/null \
    | diff -q - crates/ferrite-vm/src/bytecode/isa.rs >/dev/null \
    || { echo "crates/ferrite-vm/src/bytecode/isa.rs differs from scripts/gen-isa.py $ISA_JSON"; exit 1; }
  echo "isa.rs: regenerated from $ISA_JSON, no diff"
else
  [[ "${FERRITE_REQUIRE_UPSTREAM:-}" == 1 ]] && { echo "isa.json not found at $ISA_JSON (set FERRITE_ISA_JSON)"; exit 1; }
  echo "SKIPPED isa.rs regeneration check: isa.json not found at $ISA_JSON (set FERRITE_ISA_JSON)"
fi
step "cargo test"
mkdir -p build
if cargo test --workspace 2>&1 | tee build/cargo-test.log | grep -E '^(test result|     Running)'; then
  grep -q 'test result: FAILED' build/cargo-test.log && { tail -80 build/cargo-test.log; exit 1; }
else
  tail -80 build/cargo-test.log
  exit 1
fi
step "our programs under upstream iree-run-module (differential baseline)"
scripts/check-upstream.sh
step "upstream VM test programs under ferrite"
cargo build -q -p ferrite-cli
if [[ -n "${IREE_MIRROR:-}" ]]; then
  RUNNER="target/debug/ferrite run-module" scripts/upstream-vm-suite.sh
  # The same programs with the compiling tier off: both tiers must pass.
  RUNNER="target/debug/ferrite run-module --vm_jit=false" scripts/upstream-vm-suite.sh
elif [[ "${FERRITE_REQUIRE_UPSTREAM:-}" == 1 && "${FERRITE_ALLOW_MISSING_MIRROR:-}" != 1 ]]; then
  echo "IREE_MIRROR is not set, and FERRITE_REQUIRE_UPSTREAM=1 forbids skipping the upstream VM suite"
  exit 1
else
  echo "SKIPPED upstream VM suite: IREE_MIRROR is not set (point it at a clone or bare mirror of iree-org/iree)"
fi
step "python package (ferrite.runtime) and its tests"
.venv/bin/python -c "import maturin, pytest, numpy" 2>/dev/null || .venv/bin/pip install -q maturin pytest numpy
.venv/bin/maturin develop --release -q
.venv/bin/pytest -q -rs tests/python
echo
echo "all tests passed"
