"""Compiles the LLM example's program (examples/llm/model.py) for NVIDIA GPUs
with the pinned compiler: `build/llm/smollm2-cuda.vmfb` (not committed; built
where it is used). Weights stay named parameters of scope `model`, read from
the `.gguf`, their blocks packed.

The MLIR is `model.build_mlir(gpu=True)`: the CPU program's math and entry
points, with the decode step's matrix products, LM head and two attention
kernels written so that the pinned compiler can be given a compilation
config of ours (a subgroup per row, lanes across the blocks of a row:
model.py, `warp_rows_cfg`), which its own heuristics do not find for these
generics (they compile to a serial loop per row; the decode step was 6.2 ms
of which 0.93 ms the LM head); the layer norms are applied inside the
matvecs that read them (one dispatch fewer per norm). Prefill multiplies each matrix as a dequantized
f32 copy made per call (`matmul_q4_1_wide`). The CPU program
(`model.build_mlir()`) is unchanged.

    .venv/bin/python examples/llm/build_cuda.py [--sm sm_80] [--out build/llm/smollm2-cuda.vmfb]
    .venv/bin/python examples/llm/build_cuda.py --batch [--out build/llm/smollm2_batch-cuda.vmfb]

`--batch` compiles the batch program instead (`model.build_batch_mlir(gpu=True)`,
docs/llm-batch.md): decode_slot and prefill_slot with the single cuda
program's kernels, decode_batch and step with its one-row kernels run per
row (configs of ours), no dequantize-once f32 matmuls (wide_batch_min past
step_rows). `BatchLlm::load_with_program(gguf, "cuda", Some(path))` or
`ferrite serve --batch_module=PATH` runs it.

The default target is sm_80, as every cuda module of this project: the
pinned compiler (3.13.0) refuses sm_90 ("missing GPU target"), and the
driver runs sm_80 code on Hopper (H100, H200).

Then, on a machine with the GPU:

    ferrite generate --gguf=PATH.gguf --device=cuda --module=build/llm/smollm2-cuda.vmfb --chat="Hi"
    python -c "import ferrite.llm as l; m = l.load('PATH.gguf', 'cuda', program='build/llm/smollm2-cuda.vmfb'); print(m.chat('Hi'))"
    .venv/bin/python scripts/bench-llm.py --device cuda      (upstream iree.runtime on the same vmfb too)
"""

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import model  # noqa: E402

BIN = Path(sys.executable).parent
DEFAULT_OUT = ROOT / "build" / "llm" / "smollm2-cuda.vmfb"
DEFAULT_BATCH_OUT = ROOT / "build" / "llm" / "smollm2_batch-cuda.vmfb"


def cuda_flags(sm):
    # No constant-expression hoisting: it would turn prefill's dequantized
    # copies of the smaller matrices (attn_k, attn_v: under its size
    # threshold) into f32 globals computed at load, a conversion of the
    # weights the program must not make.
    return ["--iree-hal-target-device=cuda", f"--iree-cuda-target={sm}", "--iree-opt-const-expr-hoisting=false"]


def build(out=None, sm="sm_80", quiet=False, batch=False):
    """Writes the cuda program (batch: the batch program) to `out` (and its
    MLIR beside it, for inspection) and returns `out`."""
    out = Path(out or (DEFAULT_BATCH_OUT if batch else DEFAULT_OUT))
    out.parent.mkdir(parents=True, exist_ok=True)
    mlir = out.with_suffix(".mlir")
    mlir.write_text(model.build_batch_mlir(gpu=True) if batch else model.build_mlir(gpu=True))
    cmd = [str(BIN / "iree-compile"), *cuda_flags(sm), str(mlir), "-o", str(out)]
    if not quiet:
        print("build_cuda:", " ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sm", default="sm_80", help="CUDA target (sm_80 runs on A100, H100 and H200)")
    ap.add_argument("--batch", action="store_true", help="the batch program (KV-cache slots) instead of the single one")
    ap.add_argument("--out", type=Path, help=f"default {DEFAULT_OUT.relative_to(ROOT)}, with --batch {DEFAULT_BATCH_OUT.relative_to(ROOT)}")
    args = ap.parse_args()
    print(build(args.out, args.sm, batch=args.batch))


if __name__ == "__main__":
    main()
