"""The pip-installed `ferrite` command is the same CLI as the cargo-built
executable (crates/ferrite-cli), and its `benchmark-module
--compare-upstream` finds upstream's `iree-benchmark-module` installed in
the same Python environment (issue 30)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ferrite import _cli

ROOT = Path(__file__).resolve().parents[2]


def _console(name):
    return Path(sys.executable).with_name(name)


def _subcommands(help_text):
    # clap's "Commands:" section: two-space indented names.
    section = help_text.split("Commands:", 1)[1].split("Options:", 1)[0]
    return {m.group(1) for m in re.finditer(r"^  ([a-z0-9-]+)\s", section, re.M)}


def test_pip_ferrite_has_every_command():
    p = subprocess.run([str(_console("ferrite")), "--help"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    commands = _subcommands(p.stdout)
    for c in ("run-module", "benchmark-module", "dump-module", "check-module",
              "e2e-matmul-test", "e2e-conv2d-test", "e2e-attention-test", "generate"):
        assert c in commands, (c, sorted(commands))
    p = subprocess.run([str(_console("ferrite")), "e2e-matmul-test", "--help"],
                       capture_output=True, text=True)
    assert p.returncode == 0 and "--module" in p.stdout, p.stderr
    # The cargo-built executable, when there is one, lists the same commands.
    for profile in ("release", "debug"):
        exe = ROOT / "target" / profile / "ferrite"
        if exe.is_file():
            q = subprocess.run([str(exe), "--help"], capture_output=True, text=True)
            assert _subcommands(q.stdout) == commands, profile


def test_script_dirs_name_this_environment():
    dirs = _cli._script_dirs().split(os.pathsep)
    assert os.path.dirname(sys.executable) in dirs


def test_compare_upstream_finds_the_tool_beside_pip_ferrite(compile_program, tmp_path):
    if not _console("iree-benchmark-module").is_file():
        pytest.skip("iree-base-runtime is not installed in this environment")
    module = compile_program("arith")
    # Outside the repository (no .venv above the working directory), with
    # this environment's bin off PATH and no IREE_BENCHMARK_MODULE: only the
    # console command's own environment can lead to the tool.
    env = {k: v for k, v in os.environ.items()
           if k not in ("IREE_BENCHMARK_MODULE", "FERRITE_PYTHON_SCRIPTS", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/bin:/bin"
    p = subprocess.run(
        [str(_console("ferrite")), "benchmark-module", f"--module={module}",
         "--function=mul_i32", "--input=6", "--input=7", "--device=local-sync",
         "--benchmark_min_time=5x", "--compare-upstream"],
        capture_output=True, text=True, cwd=tmp_path, env=env)
    assert p.returncode == 0, p.stderr
    assert "upstream iree-benchmark-module" in p.stdout + p.stderr
    assert "ratio:" in p.stdout + p.stderr
