"""scripts/check-with-python.py evaluates `check` programs under a Python
runtime package (how upstream's wheel, which has no native check tool, runs
the e2e suites): its verdicts must match `ferrite check-module`'s, test by
test, under both `iree.runtime` and `ferrite.runtime`."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check-with-python.py"
EXPECTED = {
    "almost_eq_within_tolerance": "OK",
    "eq_and_true": "OK",
    "all_true": "OK",
    "almost_eq_off_by_half": "FAILED",
    "eq_off_by_one": "FAILED",
    "true_of_zero": "FAILED",
    "bf16_off_by_one": "FAILED",
}
VERDICT = re.compile(r"^\[\s*(OK|FAILED)\s*\] module\.(\w+)", re.M)


def verdicts(text):
    return {name: v for v, name in VERDICT.findall(text)}


def ferrite_bin():
    """$FERRITE, else the newest of the debug and release builds."""
    if os.environ.get("FERRITE"):
        return os.environ["FERRITE"]
    built = [p for p in (ROOT / "target" / "debug" / "ferrite", ROOT / "target" / "release" / "ferrite")
             if p.exists()]
    if not built:
        pytest.fail("no ferrite binary: build it (cargo build -p ferrite-cli) or set FERRITE")
    return str(max(built, key=lambda p: p.stat().st_mtime))


@pytest.mark.parametrize("runtime", ["iree", "ferrite"])
def test_python_checks_match_ferrite_check_module(compile_program, upstream, runtime):
    vmfb = compile_program("checks")
    p = subprocess.run([sys.executable, str(SCRIPT), "--runtime", runtime, "--device", "local-sync",
                        str(vmfb)], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout + p.stderr
    assert verdicts(p.stdout) == EXPECTED, p.stdout + p.stderr
    assert p.stdout.strip().splitlines()[-1] == "3 passed, 4 failed"
    # The failure messages name what differed.
    assert "lhs 2.0 vs rhs 2.5" in p.stdout
    assert "expected true, got 0" in p.stdout

    native = subprocess.run([ferrite_bin(), "check-module", "--device=local-sync", f"--module={vmfb}"],
                            capture_output=True, text=True)
    assert native.returncode != 0
    assert verdicts(native.stdout) == EXPECTED, native.stdout + native.stderr
