"""Regenerates the LLM example's committed program from `model.py`:
`smollm2.vmfb` (llvm-cpu, `--iree-llvmcpu-target-cpu=x86-64-v3`), weights as
named parameters of scope `model` (the GGUF's own tensor names).

    .venv/bin/python examples/llm/generate.py [--out-dir DIR] [--keep-mlir]

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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=HERE)
    ap.add_argument("--keep-mlir", action="store_true", help="also write smollm2.mlir there")
    args = ap.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    mlir = args.out_dir / "smollm2.mlir"
    mlir.write_text(model.build_mlir())
    cmd = [str(BIN / "iree-compile"), *CPU_FLAGS, str(mlir), "-o", str(args.out_dir / "smollm2.vmfb")]
    print("generate:", " ".join(cmd), flush=True)
    try:
        subprocess.run(cmd, check=True)
    finally:
        if not args.keep_mlir:
            mlir.unlink()


if __name__ == "__main__":
    main()
