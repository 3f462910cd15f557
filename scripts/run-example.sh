#!/usr/bin/env bash
# The main job on the embedded example: assembles examples/collatz.vmasm with
# the pinned upstream assembler and runs it with Ferrite.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup-venv.sh >/dev/null
mkdir -p build/examples
.venv/bin/iree-as-module --output=build/examples/collatz.vmfb examples/collatz.vmasm
cargo build -q --release -p ferrite-cli
for n in 27 97 871; do
  target/release/ferrite run-module --module=build/examples/collatz.vmfb --function=collatz_steps --input=$n
done
