"""Shared fixtures: programs compiled at test time by the pinned compiler."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = Path(__file__).parent / "programs"


def _compiler():
    for c in (ROOT / ".venv/bin/iree-compile", Path(sys.executable).parent / "iree-compile"):
        if c.exists():
            return str(c)
    return shutil.which("iree-compile")


@pytest.fixture(scope="session")
def compile_program(tmp_path_factory):
    """Compiles `programs/<name>.mlir` for a portable CPU; returns the .vmfb path."""
    compiler = _compiler()
    if compiler is None:
        pytest.skip("iree-compile (pinned iree-base-compiler) not installed")
    out_dir = tmp_path_factory.mktemp("vmfb")
    cache = {}

    def build(name, *flags):
        """`flags` are extra compiler flags, e.g. `--compile-from=vm` for a
        program written as a `vm.module`."""
        key = (name, flags)
        if key not in cache:
            out = out_dir / f"{name}{len(cache)}.vmfb"
            subprocess.run(
                [
                    compiler,
                    "--iree-hal-target-device=local",
                    "--iree-hal-local-target-device-backends=llvm-cpu",
                    "--iree-llvmcpu-target-cpu=generic",
                    *flags,
                    str(PROGRAMS / f"{name}.mlir"),
                    "-o",
                    str(out),
                ],
                check=True,
            )
            cache[key] = out
        return cache[key]

    return build


@pytest.fixture(scope="session")
def upstream():
    """The pinned `iree.runtime`, or skip when it is not installed."""
    return pytest.importorskip("iree.runtime")
