#!/usr/bin/env bash
# Runs every test of the project, installing what it needs first:
#   1. the pinned upstream tools in .venv (fixtures, differential tests),
#   2. our fixture programs compiled with them,
#   3. formatting and lint gates, the Rust test suites,
#   4. upstream's own VM test programs under our runtime (from the upstream
#      source mirror, when one is available on this machine).
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
MIRROR="${IREE_MIRROR:-/work/.mirror/iree-org+iree/repo}"
if [[ -d "$MIRROR" ]]; then
  RUNNER="target/debug/ferrite run-module" IREE_MIRROR="$MIRROR" scripts/upstream-vm-suite.sh
else
  echo "upstream source mirror not found at $MIRROR: skipping the upstream VM suite (set IREE_MIRROR)"
fi
step "python package (ferrite.runtime) and its tests"
.venv/bin/python -c "import maturin, pytest, numpy" 2>/dev/null || .venv/bin/pip install -q maturin pytest numpy
.venv/bin/maturin develop --release -q
.venv/bin/pytest -q tests/python
echo
echo "all tests passed"
