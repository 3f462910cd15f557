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


# Skips whose reason names one of these are about hardware CI never has (a
# GPU); every other skip in this suite is a missing upstream prerequisite
# (the pinned compiler or runtime), which must not pass silently in CI.
_HARDWARE_SKIP_WORDS = ("GPU", "CUDA", "cuda")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """With FERRITE_REQUIRE_UPSTREAM=1, a test skipped for a missing upstream
    prerequisite fails instead (pytest runs with -rs so skips are listed)."""
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or os.environ.get("FERRITE_REQUIRE_UPSTREAM") != "1":
        return
    reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
    if any(w in reason for w in _HARDWARE_SKIP_WORDS):
        return
    report.outcome = "failed"
    report.longrepr = f"skipped for a missing prerequisite, but FERRITE_REQUIRE_UPSTREAM=1: {reason}"


@pytest.fixture
def cuda_device():
    """The `cuda` device, or a skip naming why there is none (a failure
    when FERRITE_REQUIRE_GPU=1, as scripts/test-gpu.sh sets)."""
    import ferrite.runtime as rt

    try:
        return rt.get_device("cuda")
    except Exception as e:  # no driver or no GPU
        if os.environ.get("FERRITE_REQUIRE_GPU") == "1":
            raise
        pytest.skip(f"no CUDA device: {e}")
