"""Benchmarking modules from Python with `ferrite benchmark-module`.

`benchmark_module(module, entry_function, inputs, **flags)` runs the tool on
a module (a `VmModule`, whose bytes are piped in, or a `.vmfb` path), with
keyword arguments passed as `--key=value` flags, and returns one
`BenchmarkResult` per row of its google-benchmark JSON report.

The tool is `ferrite-benchmark-module` (the `benchmark-module` command of the
`ferrite` tools under upstream's flags), which this package installs as a
console command running inside the native module; `benchmark_exe()` finds it; `executable=` runs another tool taking the same flags
(for instance upstream's `iree-benchmark-module`).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections import namedtuple
from pathlib import Path

import numpy

from ._binding import VmModule
from .dtypes import DTYPE_TO_ABI_TYPE

__all__ = [
    "benchmark_exe",
    "benchmark_module",
]

BenchmarkResult = namedtuple(
    "BenchmarkResult", "benchmark_name time cpu_time iterations report"
)
BenchmarkResult.__doc__ = """One row of the benchmark report.

`time` and `cpu_time` are "<value> <unit>" strings (unit `%` for the `cv`
aggregate); `iterations` is a string; `report` is the row's whole JSON object.
"""


class BenchmarkToolError(Exception):
    """The tool failed, or reported a failed benchmark; carries its output."""

    def __init__(self, message):
        self.message = message
        super().__init__(self.message)


class BenchmarkTimeoutError(Exception):
    """The tool ran past the `timeout` given to `benchmark_module`."""


_TOOL_NAME = "ferrite-benchmark-module"
# A build of the whole CLI, which takes the tool as a subcommand.
_CLI_NAME = "ferrite"


def benchmark_exe():
    """Path of the benchmark tool (`iree-benchmark-module`'s flags).

    Looked up, in order: `$FERRITE_BENCHMARK_MODULE`; the
    `ferrite-benchmark-module` console command this package installs beside
    the interpreter (it runs inside the native module), else on `PATH`; the
    newest `target/{release,debug}/ferrite` of the source tree this package
    lives in (run with its `benchmark-module` subcommand). Raises
    `BenchmarkToolError` when none exists.
    """
    env = os.environ.get("FERRITE_BENCHMARK_MODULE")
    if env:
        return env
    scripts = {Path(sysconfig.get_path("scripts")), Path(sys.executable).parent}
    for directory in scripts:
        candidate = directory / _TOOL_NAME
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(_TOOL_NAME)
    if found:
        return found
    package = Path(__file__).resolve()
    builds = [
        root / "target" / profile / _CLI_NAME
        for root in package.parents
        for profile in ("release", "debug")
    ]
    builds = [b for b in builds if b.is_file() and os.access(b, os.X_OK)]
    if builds:
        return str(max(builds, key=lambda b: b.stat().st_mtime))
    raise BenchmarkToolError(
        "ferrite-benchmark-module was not found: reinstall this package (it installs the command), "
        "set FERRITE_BENCHMARK_MODULE, or build the CLI (cargo build --release -p ferrite-cli)"
    )


def _tool_command(executable):
    """The command line prefix: the whole CLI takes a subcommand, tools do not."""
    exe = os.fspath(executable) if executable is not None else benchmark_exe()
    if Path(exe).name == _CLI_NAME:
        return [exe, "benchmark-module"]
    return [exe]


def _flag_values(value):
    values = value if isinstance(value, (list, tuple)) else [value]
    for v in values:
        # The tools parse only lowercase booleans.
        if isinstance(v, bool):
            v = "true" if v else "false"
        yield v


def _input_flag(value):
    if isinstance(value, str):
        return f"--input={value}"
    array = numpy.asarray(value)
    try:
        abi_type = DTYPE_TO_ABI_TYPE[array.dtype]
    except KeyError:
        raise ValueError(f"cannot pass an array of dtype {array.dtype} as a benchmark input") from None
    flat = array.flatten()
    if flat.size and numpy.all(flat[0] == flat):
        values = str(flat[0])
    else:
        values = ",".join(str(v) for v in flat)
    shape = "x".join(str(d) for d in array.shape)
    prefix = f"{shape}x" if shape else ""
    return f"--input={prefix}{abi_type}={values}"


def _build_benchmark_args(module, entry_function=None, inputs=None, executable=None, **kwargs):
    args = _tool_command(executable)
    if isinstance(module, VmModule):
        functions = [f for f in module.function_names if f != "__init"]
        if entry_function is None:
            if len(functions) > 1:
                raise ValueError(f"No function specified with multiple options {functions}")
            entry_function = functions[0]
        if entry_function not in functions:
            raise ValueError(
                f"Attempted to benchmark unknown function {entry_function} of options {functions}"
            )
        blob = module.stashed_flatbuffer_blob
        if blob is None:
            raise ValueError(f"module '{module.name}' was not loaded from a .vmfb; pass its path")
        args.append("--module=-")
    else:
        blob = None
        args.append(f"--module={os.fspath(module)}")
    if entry_function is not None:
        args.append(f"--function={entry_function}")
    for key, value in kwargs.items():
        for v in _flag_values(value):
            args.append(f"--{key}={v}")
    for value in inputs or []:
        args.append(_input_flag(value))
    return args, blob


def _run_benchmark(args, blob=None, timeout=None):
    try:
        done = subprocess.run(
            args,
            input=blob,
            timeout=timeout,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
    except subprocess.TimeoutExpired:
        raise BenchmarkTimeoutError(f"Benchmark timed out after {timeout} seconds") from None
    out = done.stdout.decode(errors="replace")
    err = done.stderr.decode(errors="replace")
    if done.returncode != 0:
        raise BenchmarkToolError(f"stderr:\n{err}\nstdout:\n{out}")
    return out, err


def benchmark_module(
    module,
    entry_function=None,
    inputs=None,
    timeout=None,
    executable=None,
    **kwargs,
):
    """Benchmarks `entry_function` of `module`; returns the report's rows.

    Keyword arguments become `--key=value` flags (once per element of a list
    or tuple), e.g. `device="local-task"`, `benchmark_repetitions=3`.
    Without an entry function, a module file has every exported function
    that takes no arguments timed. Raises `BenchmarkToolError` when the tool
    fails and `BenchmarkTimeoutError` past `timeout` seconds.
    """
    if "benchmark_out" in kwargs or "benchmark_out_format" in kwargs:
        raise ValueError("benchmark_module reads results from its own JSON file")
    with tempfile.TemporaryDirectory() as directory:
        report = os.path.join(directory, "results.json")
        args, blob = _build_benchmark_args(
            module,
            entry_function=entry_function,
            inputs=inputs,
            executable=executable,
            benchmark_out=report,
            benchmark_out_format="json",
            **kwargs,
        )
        _run_benchmark(args, blob, timeout)
        with open(report) as file:
            return _parse_benchmark_results(file.read())


def _parse_benchmark_results(report):
    """Rows of a google-benchmark JSON report (empty when nothing ran)."""
    if not report.strip():
        return []
    results = []
    for run in json.loads(report)["benchmarks"]:
        if run.get("error_occurred"):
            raise BenchmarkToolError(f"{run['name']}: {run['error_message']}")
        unit = run["time_unit"]
        real_time, cpu_time = run["real_time"], run["cpu_time"]
        if run.get("aggregate_unit") == "percentage":
            unit = "%"
            real_time *= 100
            cpu_time *= 100
        results.append(
            BenchmarkResult(
                benchmark_name=run["name"],
                time=f"{real_time} {unit}",
                cpu_time=f"{cpu_time} {unit}",
                iterations=str(run["iterations"]),
                report=run,
            )
        )
    return results
