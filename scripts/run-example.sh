#!/usr/bin/env bash
# The main job on the embedded example: classifies scikit-learn's handwritten
# digits with a small MLP compiled by the pinned IREE compiler
# (examples/digits/digits.vmfb, committed with its held-out test set), run
# through Ferrite's Rust API (crates/ferrite/examples/digits.rs) on local-task.
# Needs no network: the model and data are committed; examples/digits/generate.sh
# retrains and recompiles them.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup-venv.sh >/dev/null
cargo run -q --release -p ferrite --example digits -- "$@"
