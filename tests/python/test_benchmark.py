"""benchmark_module: `ferrite benchmark-module` driven from Python."""

from pathlib import Path

import numpy as np
import pytest

import ferrite.runtime as rt
from ferrite.runtime import benchmark

UPSTREAM_TOOL = Path(__file__).resolve().parents[2] / ".venv/bin/iree-benchmark-module"


def test_rows_of_a_module_file(compile_program):
    rows = rt.benchmark_module(
        compile_program("arith"),
        entry_function="mul_i32",
        inputs=["6", "7"],
        device="local-sync",
        benchmark_repetitions=2,
        benchmark_min_time="5x",
    )
    base = "BM_mul_i32/process_time/real_time"
    assert [r.benchmark_name for r in rows] == [base, base] + [
        f"{base}_{a}" for a in ("mean", "median", "stddev", "cv")
    ]
    for r in rows[:2]:
        assert r.iterations == "5"
        value, unit = r.time.split()
        assert unit == "ms" and float(value) > 0
        assert r.report["run_type"] == "iteration"
    assert rows[-1].time.endswith(" %") and rows[-1].report["aggregate_unit"] == "percentage"
    mean = float(rows[2].time.split()[0])
    assert mean == pytest.approx((float(rows[0].time.split()[0]) + float(rows[1].time.split()[0])) / 2)


def test_vm_module_and_numpy_inputs(compile_program):
    instance = rt.VmInstance()
    module = rt.VmModule.mmap(instance, str(compile_program("arith")))
    a = np.arange(4, dtype=np.float32)
    rows = rt.benchmark_module(
        module,
        entry_function="add",
        inputs=[a, np.full(4, 2.0, dtype=np.float32)],
        device="local-task",
        benchmark_min_time="3x",
    )
    assert [r.benchmark_name for r in rows] == ["BM_add/process_time/real_time"]
    assert rows[0].iterations == "3"
    with pytest.raises(ValueError, match="No function specified with multiple options"):
        rt.benchmark_module(module)
    with pytest.raises(ValueError, match="unknown function nope"):
        rt.benchmark_module(module, entry_function="nope")


def test_failures_and_timeouts(compile_program):
    vmfb = compile_program("arith")
    with pytest.raises(benchmark.BenchmarkToolError, match="input list and function mismatch"):
        rt.benchmark_module(vmfb, entry_function="mul_i32", inputs=["1"], device="local-sync")
    with pytest.raises(benchmark.BenchmarkTimeoutError):
        rt.benchmark_module(
            vmfb, entry_function="mul_i32", inputs=["1", "2"], device="local-sync",
            benchmark_min_time="30s", timeout=0.5,
        )
    with pytest.raises(ValueError, match="own JSON file"):
        rt.benchmark_module(vmfb, entry_function="mul_i32", benchmark_out="x.json")
    # Every function takes arguments: nothing to time without --function.
    assert rt.benchmark_module(vmfb, device="local-sync", benchmark_min_time="1x") == []


def test_same_report_shape_as_upstream_tool(compile_program):
    if not UPSTREAM_TOOL.exists():
        pytest.skip("pinned iree-benchmark-module not installed")
    common = dict(
        entry_function="mul_i32", inputs=["3", "4"], device="local-sync",
        benchmark_repetitions=3, benchmark_min_time="4x",
    )
    ours = rt.benchmark_module(compile_program("arith"), **common)
    theirs = rt.benchmark_module(compile_program("arith"), executable=UPSTREAM_TOOL, **common)
    assert [r.benchmark_name for r in ours] == [r.benchmark_name for r in theirs]
    assert [r.iterations for r in ours] == [r.iterations for r in theirs]
    for a, b in zip(ours, theirs):
        assert a.time.split()[1] == b.time.split()[1]
        for key in ("run_type", "aggregate_name", "aggregate_unit", "repetitions", "time_unit"):
            assert a.report.get(key) == b.report.get(key), key


def test_console_commands_ship_with_the_package():
    import shutil
    import subprocess

    from ferrite import _ferrite

    exe = benchmark.benchmark_exe()
    assert Path(exe).name == "ferrite-benchmark-module"
    p = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert p.returncode == 0 and "--benchmark_out" in p.stdout
    cli = Path(exe).with_name("ferrite")
    p = subprocess.run([str(cli), "--version"], capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.startswith("ferrite ")
    # In-process, bad usage is an exit status, never the end of the interpreter.
    assert _ferrite.cli_main(["ferrite", "no-such-command"]) == 2


def test_argument_lists_as_upstream(upstream):
    from iree.runtime import benchmark as theirs

    a = np.arange(3, dtype=np.int32)
    for inputs in ([a], ["4xf32=1"], [np.full((2, 2), 1.5, dtype=np.float32)]):
        kwargs = dict(module="m.vmfb", entry_function="f", inputs=inputs, device="local-task",
                      benchmark_repetitions=2, print_statistics=True, task_topology_cpu_ids=[0, 1])
        ours, _ = benchmark._build_benchmark_args(**kwargs)
        up, _ = theirs._build_benchmark_args(**kwargs)
        assert ours[1:] == up[1:]
