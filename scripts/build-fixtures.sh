#!/usr/bin/env bash
# Builds the VM test fixtures from their checked-in sources with the pinned
# upstream tools:
#   tests/vm/*.vmasm -> build/fixtures/vm/<name>.vmfb   (iree-as-module)
#   tests/vm/*.mlir  -> build/fixtures/vm/<name>.vmfb   (iree-compile)
# A fixture is rebuilt only when its source is newer than its output.
# Any tool error stops the script with a non-zero exit status.
#
# Environment:
#   VENV     virtual environment holding the tools (default: <repo>/.venv)
#   FORCE=1  rebuild everything
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
SRC_DIR="$ROOT/tests/vm"
OUT_DIR="$ROOT/build/fixtures/vm"
AS_MODULE="$VENV/bin/iree-as-module"
COMPILE="$VENV/bin/iree-compile"

mkdir -p "$OUT_DIR"
shopt -s nullglob
sources=("$SRC_DIR"/*.vmasm "$SRC_DIR"/*.mlir)
total=${#sources[@]}
if [[ $total -eq 0 ]]; then
  echo "build-fixtures: no sources under tests/vm" >&2
  exit 1
fi

built=0
skipped=0
i=0
for src in "${sources[@]}"; do
  i=$((i + 1))
  rel="${src#$ROOT/}"
  base="$(basename "$src")"
  name="${base%.*}"
  out="$OUT_DIR/$name.vmfb"
  if [[ "${FORCE:-0}" != 1 && -f "$out" && "$out" -nt "$src" ]]; then
    skipped=$((skipped + 1))
    continue
  fi
  case "$src" in
    *.vmasm)
      [[ -x "$AS_MODULE" ]] || { echo "build-fixtures: missing $AS_MODULE (run scripts/setup-venv.sh)" >&2; exit 1; }
      echo "[$i/$total] assembling $rel"
      if ! "$AS_MODULE" --output="$out.tmp" "$src"; then
        rm -f "$out.tmp"
        echo "build-fixtures: FAILED to assemble $rel" >&2
        exit 1
      fi
      ;;
    *.mlir)
      [[ -x "$COMPILE" ]] || { echo "build-fixtures: missing $COMPILE (run scripts/setup-venv.sh)" >&2; exit 1; }
      if grep -q '^[[:space:]]*vm\.module' "$src"; then
        # A program written directly in the VM dialect (no tensors).
        echo "[$i/$total] compiling (vm) $rel"
        cmd=("$COMPILE" --compile-mode=vm "$src" -o "$out.tmp")
      else
        # A tensor program: portable CPU code, never 'host'.
        echo "[$i/$total] compiling (llvm-cpu) $rel"
        cmd=("$COMPILE" --iree-hal-target-device=local
             --iree-hal-local-target-device-backends=llvm-cpu
             --iree-llvmcpu-target-cpu=generic "$src" -o "$out.tmp")
      fi
      if ! "${cmd[@]}"; then
        rm -f "$out.tmp"
        echo "build-fixtures: FAILED to compile $rel" >&2
        exit 1
      fi
      ;;
  esac
  mv -f "$out.tmp" "$out"
  built=$((built + 1))
done
echo "build-fixtures: $built built, $skipped up to date, $total total -> ${OUT_DIR#$ROOT/}"
