"""Regenerates the LLM example's committed programs from `model.py`:
`smollm2.vmfb` (one sequence) and `smollm2_batch.vmfb` (KV-cache slots for
continuous batching), llvm-cpu, `--iree-llvmcpu-target-cpu=x86-64-v3`,
weights as named parameters of scope `model` (the GGUF's own tensor names).

    .venv/bin/python examples/llm/generate.py [--out-dir DIR] [--keep-mlir] [--only single|batch]

For a GPU, `examples/llm/build_cuda.py [--batch]` compiles the programs'
cuda formulations (`model.build_mlir(gpu=True)`, `model.build_batch_mlir(gpu=True)`:
kernels given compilation configs of ours) for sm_80.

Needs only the pinned compiler (`iree-base-compiler==3.13.0`) in the venv;
the weights are not read at compile time.
"""

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import model  # noqa: E402

BIN = Path(sys.executable).parent
CPU_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=x86-64-v3",
    # Lets the vectorized reductions (the quantized matvecs' 16- and 32-lane
    # block sums) add lanes in a tree instead of one ordered scalar chain;
    # without it a decode step is several times slower (model.py).
    "--iree-llvmcpu-reassociate-fp-reductions=true",
]
# Per program: its file stem, its MLIR and flags of its own. The single
# program's prefill multiplies f32 copies of the matrices dequantized per call
# (model.py, matmul_q4_1_wide), which constant-expression hoisting may turn
# into f32 globals computed at load, a conversion of the weights the program
# must not make: an earlier form of that prefill got one
# (`__hoisted_tensor_192x18x2x16xf32`). The committed form compiles to the
# same vmfb either way; the flag keeps it so (tests/llm/test_prefill.py).
PROGRAMS = {
    "single": ("smollm2", model.build_mlir, ["--iree-opt-const-expr-hoisting=false"]),
    "batch": ("smollm2_batch", model.build_batch_mlir, []),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--keep-mlir", action="store_true", help="also write the .mlir files there")
    ap.add_argument("--only", choices=sorted(PROGRAMS), help="build one program (default: both)")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for key in [args.only] if args.only else sorted(PROGRAMS, reverse=True):
        stem, build, flags = PROGRAMS[key]
        mlir = args.out_dir / f"{stem}.mlir"
        mlir.write_text(build())
        # Compiled from inside the output directory with relative names: the
        # source locations the compiler keeps in the .vmfb then name
        # `smollm2.mlir`, not this machine's path to it.
        cmd = [str(BIN.resolve() / "iree-compile"), *CPU_FLAGS, *flags, mlir.name, "-o", f"{stem}.vmfb"]
        print("generate:", " ".join(cmd), f"(in {args.out_dir})", flush=True)
        try:
            subprocess.run(cmd, check=True, cwd=args.out_dir)
        finally:
            if not args.keep_mlir:
                mlir.unlink()


if __name__ == "__main__":
    main()
