#!/usr/bin/env bash
# Builds what scripts/test-gpu.sh and scripts/bench-gpu.sh need into
# build/gpu (git-ignored, carried to the GPU machine, which has no compiler
# or registry): the release `ferrite` binary, the CUDA driver's test
# executables (gpu, gpu_fault, nccl, profile_gpu), the facade's async_calls_gpu test
# (calls as futures on cuda) with its module, the differential modules of
# tests/cuda/cases.txt and the check programs of tests/cuda/checks (each
# for cuda sm_80 and for the CPU), the bench
# modules, upstream's e2e suites for cuda (from ../shared/upstream-e2e), and
# upstream's cp312 runtime wheel (for its iree-run-module and
# iree-benchmark-module) when pip can fetch it or UPSTREAM_WHEEL names it.
#
# On the GPU machine, from the repository root (carry build/gpu):
#   bash build/gpu/run.sh test     # scripts/test-gpu.sh over these inputs
#   bash build/gpu/run.sh bench    # scripts/bench-gpu.sh, with and without graphs
#   bash build/gpu/run.sh llm      # the LLM on cuda (tests/llm/test_cuda.py, the batch
#                                  # program's test_cuda_batch_program_on_a_gpu;
#                                  # FERRITE_CACHE/llm holds the .gguf)
#   bash build/gpu/run.sh py       # the CUDA Python tests (GPU_BUILD_PYTHON=1
#                                  # builds the abi3 wheel they need)
# FERRITE_BUILD_LOCK: a file to hold a shared flock on while compiling
# (machines where benchmarks take it exclusively); none when unset.
set -euo pipefail
cd "$(dirname "$0")/.."
locked() { if [ -n "${FERRITE_BUILD_LOCK:-}" ]; then flock -s "$FERRITE_BUILD_LOCK" "$@"; else "$@"; fi; }
G=build/gpu
IC=.venv/bin/iree-compile
[ -x "$IC" ] || { echo "gpu-build: $IC not found (run scripts/setup-venv.sh)"; exit 1; }
CUDA="--iree-hal-target-device=cuda --iree-cuda-target=sm_80"
CPU="--iree-hal-target-device=local --iree-hal-local-target-device-backends=llvm-cpu --iree-llvmcpu-target-cpu=generic"
rm -rf $G/bin $G/tests $G/diff $G/bench && mkdir -p $G/bin $G/tests $G/diff $G/bench

# GPU_BUILD_PROFILE=debug builds without optimisation (minutes instead of
# a fat-LTO link; for correctness runs, not for figures).
PROFILE=${GPU_BUILD_PROFILE:-release}
case $PROFILE in
  release) cargo_profile=(--release) ;;
  debug) cargo_profile=() ;;
  *) echo "gpu-build: GPU_BUILD_PROFILE must be release or debug"; exit 1 ;;
esac
echo "gpu-build: $PROFILE binary and the driver's test executables (gpu, gpu_fault, nccl, the HAL CTS)"
locked nice cargo build -q "${cargo_profile[@]}" -p ferrite-cli
cp target/$PROFILE/ferrite $G/bin/
locked nice cargo test -q "${cargo_profile[@]}" -p ferrite-hal-cuda \
  --test gpu --test gpu_fault --test nccl --test cts --test profile_gpu --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' |
  while read -r exe; do
    cp "$exe" "$G/tests/$(basename "$exe" | sed 's/-[0-9a-f]*$//')"
  done
# The facade's calls as futures on cuda, with its module beside it (the
# GPU machine has no compiler).
locked nice cargo test -q "${cargo_profile[@]}" -p ferrite --test async_calls_gpu \
  --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except Exception: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' |
  while read -r exe; do cp "$exe" "$G/tests/async_calls_gpu"; done
mkdir -p $G/tests/async-modules
$IC $CUDA --iree-execution-model=async-external tests/hal/async_axpy.mlir \
  -o $G/tests/async-modules/async_axpy.cuda.vmfb
strip $G/bin/* $G/tests/* 2>/dev/null || true
# The CTS's executables (no compiler on the GPU machine): FERRITE_CTS_MODULES.
locked nice cargo run -q "${cargo_profile[@]}" -p ferrite-hal-cts --bin cts-modules "$G/tests/cts-modules"

echo "gpu-build: differential modules (tests/cuda/cases.txt)"
cp tests/cuda/cases.txt $G/diff/
grep -v '^#' tests/cuda/cases.txt | awk 'NF {print $1}' | sort -u | while read -r module; do
  m=${module/\//_}
  $IC $CUDA "tests/$module.mlir" -o "$G/diff/$m.cuda.vmfb"
  $IC $CPU "tests/$module.mlir" -o "$G/diff/$m.cpu.vmfb"
done

# The profile bundle check of scripts/test-gpu.sh.
$IC $CUDA tests/trace/two_matmuls.mlir -o "$G/diff/trace_two_matmuls.cuda.vmfb"

echo "gpu-build: check programs (tests/cuda/checks)"
rm -rf $G/checks && mkdir -p $G/checks
for f in tests/cuda/checks/*.mlir; do
  n=$(basename "$f" .mlir)
  $IC $CUDA "$f" -o "$G/checks/$n.cuda.vmfb"
  $IC $CPU "$f" -o "$G/checks/$n.cpu.vmfb"
done

echo "gpu-build: bench modules"
$IC $CUDA benches/hal/add.mlir -o $G/bench/bench_add.vmfb
$IC $CUDA benches/hal/chain100.mlir -o $G/bench/bench_chain100.vmfb
$IC $CUDA benches/cuda/matmul2048.mlir -o $G/bench/bench_matmul2048.vmfb
cp examples/minilm/minilm_cuda.vmfb $G/bench/bench_minilm.vmfb

if [ -d $G/e2e ] && [ "${GPU_E2E_REBUILD:-0}" != 1 ]; then
  echo "gpu-build: keeping $G/e2e (GPU_E2E_REBUILD=1 rebuilds it)"
else
  echo "gpu-build: upstream e2e suites for cuda (from ${UPSTREAM_E2E:-../shared/upstream-e2e})"
  rm -rf $G/e2e
  scripts/gpu-e2e-build.sh $G/e2e | grep -v "does not compile" || true
  find $G/e2e -name '*.vmfb' | wc -l | xargs echo "gpu-build: e2e modules:"
fi

if [ "${GPU_BUILD_PYTHON:-0}" = 1 ]; then
  echo "gpu-build: the ferrite wheel (abi3)"
  rm -rf $G/pywheel
  # The GPU machine runs CPython 3.12.
  locked nice .venv/bin/maturin build --release -q -i "${PYTHON312:-python3.12}" -o $G/pywheel
fi

echo "gpu-build: the LLM example's cuda programs, single and batch (run.sh llm)"
rm -rf $G/llm && mkdir -p $G/llm
locked nice .venv/bin/python examples/llm/build_cuda.py --out $G/llm/smollm2-cuda.vmfb >/dev/null
# The batch program for `ferrite serve --batch_module=$G/llm/smollm2_batch-cuda.vmfb`
# (docs/llm-batch.md) and batch_bench's FERRITE_BATCH_PROGRAM.
locked nice .venv/bin/python examples/llm/build_cuda.py --batch --out $G/llm/smollm2_batch-cuda.vmfb >/dev/null
rm -f $G/llm/*.mlir

mkdir -p $G/.whl
if [ -n "${UPSTREAM_WHEEL:-}" ] && [ -f "$UPSTREAM_WHEEL" ]; then
  cp "$UPSTREAM_WHEEL" $G/.whl/
elif ! ls $G/.whl/iree_base_runtime-3.13.0-*.whl >/dev/null 2>&1; then
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    -d $G/.whl iree-base-runtime==3.13.0 ||
    echo "gpu-build: could not fetch upstream's cp312 wheel: runs without UPSTREAM_BIN"
fi

# iree-profile-render's Perfetto output (test-gpu.sh's bundle check) needs
# the perfetto and protobuf packages; run.sh installs every wheel here.
if ! ls $G/.whl/perfetto-*.whl $G/.whl/protobuf-*.whl >/dev/null 2>&1; then
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
    -d $G/.whl "perfetto==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("perfetto"))')" \
    "protobuf==$(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("protobuf"))')" ||
    echo "gpu-build: could not fetch perfetto/protobuf: the Perfetto render check will fail there"
fi

cat >$G/run.sh <<'EOF'
#!/usr/bin/env bash
# Runs on the GPU machine from the repository root; see scripts/gpu-build.sh.
set -uo pipefail
G=build/gpu
export FERRITE=$G/bin/ferrite
if ls $G/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/upstream $G/.whl/*.whl &&
    export UPSTREAM_BIN=/tmp/upstream/iree/_runtime_libs UPSTREAM_PYTHONPATH=/tmp/upstream
fi
case ${1:-test} in
  test) GPU_TESTS=$G/tests DIFF_DIR=$G/diff CHECK_DIR=$G/checks E2E_DIR=$G/e2e scripts/test-gpu.sh ;;
  bench)
    out=${BENCH_OUT:-/tmp/gpu-bench}
    mkdir -p "$out" && rm -f "$out/gpu-bench.json"
    JSON_OUT=$out/gpu-bench.json MODULES=$G/bench ROUNDS=${ROUNDS:-3} scripts/bench-gpu.sh
    python3 scripts/plot-gpu.py "$out/gpu-bench.json" "$out/gpu-bench.png"
    echo "== FERRITE_CUDA_GRAPHS=0"
    FERRITE_CUDA_GRAPHS=0 MODULES=$G/bench ROUNDS=${ROUNDS:-3} scripts/bench-gpu.sh ;;
  py)
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ferrite-py $G/pywheel/*.whl || exit 1
    cp $G/bench/bench_add.vmfb /tmp/add_cuda.vmfb
    PYTHONPATH=/tmp/ferrite-py FERRITE_REQUIRE_GPU=1 FERRITE_CUDA_ADD_VMFB=/tmp/add_cuda.vmfb \
      python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_cuda.py \
      tests/python/test_dlpack_cuda.py tests/python/test_dlpack_loop.py ;;
  llm)
    # The LLM on cuda with the real weights: FERRITE_CACHE/llm must hold
    # the .gguf (the machine has no network); the ferrite wheel and
    # upstream's are installed as for `py`.
    [ -n "${FERRITE_CACHE:-}" ] || { echo "run.sh llm: set FERRITE_CACHE (the folder whose llm/ holds SmolLM2-135M-Instruct.Q4_1.gguf)"; exit 2; }
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ferrite-py $G/pywheel/*.whl || exit 1
    PYTHONPATH=/tmp/ferrite-py:/tmp/upstream FERRITE_REQUIRE_GPU=1 FERRITE_BIN=$G/bin/ferrite \
      FERRITE_LLM_CUDA_VMFB=$G/llm/smollm2-cuda.vmfb FERRITE_LLM_CUDA_BATCH_VMFB=$G/llm/smollm2_batch-cuda.vmfb \
      python3 -m pytest -q -rs -p no:cacheprovider tests/llm/test_cuda.py \
      tests/llm/test_cuda_batch_program.py::test_cuda_batch_program_on_a_gpu ;;
  *) echo "usage: run.sh test|bench|py|llm"; exit 2 ;;
esac
EOF
du -sh $G
