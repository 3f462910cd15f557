"""Regenerates the MiniLM example's committed programs from `model.py`:

- `minilm.vmfb`: CPU (llvm-cpu, `--iree-llvmcpu-target-cpu=x86-64-v3`),
  weights as named parameters of scope `model` (the safetensors names);
- `minilm_cuda.vmfb`: the same for CUDA (`sm_80`).

With `--inline OUT.vmfb` it also writes the CPU program with the weights
inlined as constants (90 MB, never committed; the benches use it).

    .venv/bin/python examples/minilm/generate.py [--inline build/minilm/minilm_inline.vmfb]

Needs the pinned compiler (`iree-base-compiler==3.13.0`, its `iree-import-onnx`)
and the `onnx` package in the venv (installed here when missing); the weights
come from `assets.py`'s cache (their values only matter for `--inline`, the
parameterized programs read them at run time).
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import assets  # noqa: E402
import model  # noqa: E402

BIN = Path(sys.executable).parent
CPU_FLAGS = [
    "--iree-hal-target-device=local",
    "--iree-hal-local-target-device-backends=llvm-cpu",
    "--iree-llvmcpu-target-cpu=x86-64-v3",
]
CUDA_FLAGS = ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"]
# Weights have at least 384 elements; the graph's own small constants (shape
# vectors, the 128 position ids, scalars) stay inline.
PARAM_THRESHOLD = 256


def run(cmd):
    print("generate:", " ".join(str(c) for c in cmd), flush=True)
    subprocess.run([str(c) for c in cmd], check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inline", type=Path, help="also write the constants-inlined CPU program here")
    ap.add_argument("--no-cuda", action="store_true", help="skip minilm_cuda.vmfb")
    ap.add_argument("--out-dir", type=Path, default=HERE, help="where the parameterized programs go")
    args = ap.parse_args()
    try:
        import onnx
    except ImportError:
        run([sys.executable, "-m", "pip", "install", "-q", "onnx"])
        import onnx

    weights_path, _ = assets.ensure()
    weights = model.read_safetensors(weights_path)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        onnx_path = tmp / "minilm.onnx"
        onnx.save(model.build_onnx(weights), onnx_path)
        params_mlir = tmp / "minilm_params.mlir"
        run(
            [
                BIN / "iree-import-onnx",
                onnx_path,
                "--externalize-params",
                f"--num-elements-threshold={PARAM_THRESHOLD}",
                "--params-scope=model",
                "--no-save-params",
                "-o",
                params_mlir,
            ]
        )
        args.out_dir.mkdir(parents=True, exist_ok=True)
        run([BIN / "iree-compile", *CPU_FLAGS, params_mlir, "-o", args.out_dir / "minilm.vmfb"])
        if not args.no_cuda:
            run([BIN / "iree-compile", *CUDA_FLAGS, params_mlir, "-o", args.out_dir / "minilm_cuda.vmfb"])
        if args.inline:
            inline_mlir = tmp / "minilm_inline.mlir"
            run([BIN / "iree-import-onnx", onnx_path, "-o", inline_mlir])
            args.inline.parent.mkdir(parents=True, exist_ok=True)
            run([BIN / "iree-compile", *CPU_FLAGS, inline_mlir, "-o", args.inline])
    os.sync()


if __name__ == "__main__":
    main()
