#!/usr/bin/env bash
# Builds what scripts/test-multi-gpu.sh needs into build/multi-gpu (git-
# ignored, carried to the GPU machine, which has no compiler or registry):
# the release `ferrite` binary, the NCCL test executables (ferrite-hal-cuda's
# nccl and multi_gpu, ferrite's multi_gpu), the collective programs compiled
# for cuda sm_80, the scripts, and upstream's runtime wheel when one is at
# $UPSTREAM_WHEEL (for its iree-run-module).
# FERRITE_BUILD_LOCK: a file to hold a shared flock on while compiling
# (machines where benchmarks take it exclusively); none when unset.
set -euo pipefail
cd "$(dirname "$0")/.."
locked() { if [ -n "${FERRITE_BUILD_LOCK:-}" ]; then flock -s "$FERRITE_BUILD_LOCK" "$@"; else "$@"; fi; }
G=build/multi-gpu
IC=.venv/bin/iree-compile
CUDA="--iree-hal-target-device=cuda --iree-cuda-target=sm_80"
rm -rf $G && mkdir -p $G/bin $G/tests $G/vmfb $G/scripts
locked nice cargo build -q --release -p ferrite-cli
cp target/release/ferrite $G/bin/
locked nice cargo test -q --release -p ferrite-hal-cuda -p ferrite \
  --test multi_gpu --test nccl --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["package_id"].split("#")[0].rsplit("/",1)[-1], m["executable"])' |
  while read -r pkg exe; do
    cp "$exe" "$G/tests/$pkg-$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
  done
strip $G/bin/* $G/tests/* 2>/dev/null || true
for m in two_ranks tp_matmul; do
  $IC $CUDA tests/collectives/$m.mlir -o $G/vmfb/$m.cuda.vmfb
done
cp scripts/test-multi-gpu.sh scripts/multi-gpu/torch_allreduce.py $G/scripts/
if [ -n "${UPSTREAM_WHEEL:-}" ] && [ -f "$UPSTREAM_WHEEL" ]; then
  mkdir -p $G/.whl && cp "$UPSTREAM_WHEEL" $G/.whl/
fi
du -sh $G
