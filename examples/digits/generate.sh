#!/usr/bin/env bash
# Regenerates the digits example's committed files (digits.mlir, digits.vmfb,
# test_images.npy, test_labels.npy, test_predictions.npy, metrics.txt):
# makes sure the project venv has the pinned IREE tools and scikit-learn,
# then runs train.py. Needs no network once scikit-learn is installed
# (load_digits() ships with scikit-learn).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
scripts/setup-venv.sh >/dev/null
if ! .venv/bin/python -c "import sklearn" 2>/dev/null; then
  echo "generate.sh: installing scikit-learn into .venv"
  .venv/bin/python -m pip install scikit-learn
fi
exec .venv/bin/python examples/digits/train.py
