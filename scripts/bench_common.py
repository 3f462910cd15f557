"""Helpers the Python benchmark scripts share."""
import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_for_host(src_text, name):
    """Compiles MLIR `src_text` with the pinned iree-compile for this CPU into
    build/bench/<name>.vmfb (the source goes beside it) and returns the path."""
    out = os.path.join(ROOT, "build", "bench", name + ".vmfb")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    src = out.replace(".vmfb", ".mlir")
    with open(src, "w") as f:
        f.write(src_text)
    subprocess.run([os.path.join(ROOT, ".venv", "bin", "iree-compile"),
                    "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    "--iree-llvmcpu-target-cpu=host", src, "-o", out], check=True)
    return out
