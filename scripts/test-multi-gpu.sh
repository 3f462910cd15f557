#!/usr/bin/env bash
# The multi-GPU suite, run on a machine with 2 or more NVIDIA GPUs and NCCL
# (PyTorch's copy is found through python3 when FERRITE_NCCL_LIBRARY is not
# set). Builds nothing: scripts/multi-gpu-build.sh prepares build/multi-gpu
# here, which is carried there. Prints progress, figures and
# `N passed, M failed`; exits 1 on any failure (a skipped test is one).
#
#   1. NCCL tests of the cuda driver (one GPU: every kind on a group of one,
#      bad parameters; two GPUs: every kind against expected values, splits)
#      and Ferrite programs compiled for cuda on 2 GPUs: one process driving
#      both (ferrite::spmd) and two processes (RANK/WORLD_SIZE/FERRITE_STORE,
#      ferrite::rendezvous), a tensor-parallel matmul against one GPU.
#   2. The same program through the CLI: two `ferrite run-module` processes
#      (launcher variables, FERRITE_STORE) and one process with
#      `--spmd_ranks=2 --device=cuda://{rank}`.
#   3. Bus bandwidth of a 1 GiB f32 all-reduce: Ferrite (HAL, NCCL on its
#      queue stream) and PyTorch's torch.distributed NCCL; the ratio.
#   4. Upstream's iree-run-module on the same program when its wheel is
#      carried and mpirun exists (upstream takes ranks from MPI only).
set -uo pipefail
G=${G:-$(cd "$(dirname "$0")/.." && pwd)}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ -z "${FERRITE_NCCL_LIBRARY:-}" ]; then
  FERRITE_NCCL_LIBRARY=$(python3 -c 'import glob, os, site
roots = site.getsitepackages() + [site.getusersitepackages()]
hits = [p for r in roots for p in sorted(glob.glob(os.path.join(r, "nvidia", "**", "libnccl.so.2"), recursive=True))]
print(hits[0] if hits else "")' 2>/dev/null || true)
  export FERRITE_NCCL_LIBRARY
fi
export FERRITE_MULTI_GPU_DIR=$G/vmfb FERRITE_REQUIRE_GPU=1
FERRITE=$G/bin/ferrite
echo "NCCL: $FERRITE_NCCL_LIBRARY"
nvidia-smi -L
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())" 2>&1 | tail -1
TEST_TIMEOUT=${TEST_TIMEOUT:-60}
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }

echo "== 1. Rust NCCL and multi-GPU tests (each alone, $TEST_TIMEOUT s limit)"
for t in "$G"/tests/*; do
  ignored=$("$t" --list --ignored 2>/dev/null | grep ": test$" | sed 's/: test$//')
  for name in $("$t" --list 2>/dev/null | grep ": test$" | sed 's/: test$//'); do
    if echo "$ignored" | grep -qx "$name"; then continue; fi
    out=$(timeout "$TEST_TIMEOUT" "$t" --exact "$name" --test-threads=1 --nocapture 2>&1)
    rc=$?
    echo "$out" | grep -E "^(two_ranks|tp_matmul|RESULT|split:)" || true
    if [ $rc -eq 0 ] && echo "$out" | grep -q "1 passed" && ! echo "$out" | grep -q "SKIPPED"; then
      ok "$(basename "$t")::$name"
    else
      bad "$(basename "$t")::$name (rc $rc): $(echo "$out" | grep -E "panicked|SKIPPED|rror" | head -5)"
    fi
  done
done

echo "== 2. CLI: two ferrite run-module processes, and one process driving both GPUs"
port=29533
token=$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')   # the job's secret for the TCP store
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 FERRITE_STORE=tcp://127.0.0.1:$port FERRITE_STORE_TOKEN=$token FERRITE_STORE_TIMEOUT=30 \
    timeout 60 "$FERRITE" run-module --device=cuda://$r --module="$G/vmfb/two_ranks.cuda.vmfb" \
    --function=all_reduce_sum --input="4xf32=$((1 + r)),2,3,$((4 * r))" >/tmp/cli.$r 2>&1 &
done
wait
for r in 0 1; do
  echo "rank $r: $(tr '\n' ' ' </tmp/cli.$r | head -c 400)"
  if grep -q "^4xf32=3 4 6 4$" /tmp/cli.$r; then ok "cli two processes, rank $r"; else bad "cli two processes, rank $r"; fi
done
out=$(timeout 60 "$FERRITE" run-module --spmd_ranks=2 --device='cuda://{rank}' \
  --module="$G/vmfb/two_ranks.cuda.vmfb" --function=all_reduce_sum --input='4xf32=1,2,3,{rank}' 2>&1)
echo "$out" | tr '\n' ' ' | head -c 400; echo
if [ "$(echo "$out" | grep -c "^4xf32=2 4 6 1$")" = 2 ]; then ok "cli --spmd_ranks=2 cuda://{rank}"; else bad "cli --spmd_ranks=2 cuda://{rank}"; fi

echo "== 3. 1 GiB f32 all-reduce bus bandwidth"
fb=$(timeout 120 "$G"/tests/ferrite-hal-cuda-multi_gpu --exact bench_all_reduce_1gib --ignored --nocapture --test-threads=1 2>&1 | grep "busbw_GBps" | head -1)
echo "$fb"
tb=$(timeout 120 python3 "$G"/scripts/torch_allreduce.py 2>&1 | grep "busbw_GBps" | head -1)
echo "$tb"
f=$(echo "$fb" | sed -n 's/.*busbw_GBps=\([0-9.]*\).*/\1/p')
t=$(echo "$tb" | sed -n 's/.*busbw_GBps=\([0-9.]*\).*/\1/p')
if [ -n "$f" ] && [ -n "$t" ]; then
  ratio=$(python3 -c "print(f'{$f/$t:.3f}')")
  echo "busbw ratio ferrite/torch = $ratio (target >= 0.9)"
  if python3 -c "import sys; sys.exit(0 if $f/$t >= 0.9 else 1)"; then ok "busbw ratio $ratio"; else bad "busbw ratio $ratio < 0.9"; fi
else
  bad "bandwidth figures missing (ferrite: '$fb', torch: '$tb')"
fi

echo "== 4. upstream iree-run-module (not counted)"
if ls "$G"/.whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$G"/.whl/*.whl >/dev/null 2>&1
  export LD_LIBRARY_PATH=$(dirname "$FERRITE_NCCL_LIBRARY"):${LD_LIBRARY_PATH:-}
  if command -v mpirun >/dev/null; then
    timeout 60 mpirun --allow-run-as-root --oversubscribe -n 2 sh -c \
      'r=${OMPI_COMM_WORLD_RANK:-$PMI_RANK}; /tmp/site/iree/_runtime_libs/iree-run-module --device=cuda://$r --module='"$G"'/vmfb/two_ranks.cuda.vmfb --function=all_reduce_sum --input=4xf32=$((1 + r)),2,3,$((4 * r))' 2>&1 | head -20
  else
    echo "no mpirun here: upstream's tools take ranks from MPI only (OMPI_COMM_WORLD_*/PMI_* with libmpi); single rank:"
    timeout 60 /tmp/site/iree/_runtime_libs/iree-run-module --device=cuda --module="$G/vmfb/two_ranks.cuda.vmfb" \
      --function=all_reduce_sum --input=4xf32=1,2,3,0 2>&1 | head -5
  fi
else
  echo "upstream wheel not carried"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
