"""`ferrite.runtime.start_trace` / `stop_trace` / `tracing`: the Chrome/Perfetto
JSON trace of calls made from Python (the recorder the CLI's --trace uses)."""

import json

import numpy as np
import pytest

import ferrite.runtime as frt


@pytest.fixture
def two_matmuls(compile_program):
    return compile_program("two_matmuls")


def _args():
    return (
        np.ones((32, 64), np.float32),
        np.ones((64, 16), np.float32),
        np.ones((16, 8), np.float32),
    )


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_trace_of_a_python_call(two_matmuls, tmp_path, driver):
    m = frt.load_vm_flatbuffer_file(str(two_matmuls), driver=driver)
    path = tmp_path / "t.json"
    assert not frt.is_tracing()
    with frt.tracing(path):
        assert frt.is_tracing()
        out = m.two_matmuls(*_args())
        np.testing.assert_array_equal(np.asarray(out.to_host()), np.full((32, 8), 64 * 16, np.float32))
    assert not frt.is_tracing()
    trace = json.loads(path.read_text())
    ev = trace["traceEvents"]
    by_cat = lambda c: [e for e in ev if e.get("cat") == c]
    assert [e["name"] for e in by_cat("invocation")] == ["module.two_matmuls"]
    assert any(e["name"] == "module.two_matmuls" for e in by_cat("vm"))
    names = [e["name"] for e in by_cat("dispatch")]
    assert len(names) == 2 and names[0].startswith("two_matmuls_dispatch_0") and names[1].startswith(
        "two_matmuls_dispatch_1"
    ), names
    assert all(len(e["args"]["workgroups"]) == 3 for e in by_cat("dispatch"))
    assert any(e["name"] == "execute" for e in by_cat("queue"))
    if driver == "local-task":
        assert by_cat("tile"), "local-task records the tiles each thread ran"


def test_stop_without_start_and_double_start():
    assert frt.stop_trace() is None
    frt.start_trace()
    try:
        with pytest.raises(Exception, match="already being recorded"):
            frt.start_trace()
    finally:
        text = frt.stop_trace()
    assert json.loads(text)["traceEvents"] is not None


def _iree_profile():
    import shutil
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for c in (Path(sys.executable).parent / "iree-profile", root / ".venv/bin/iree-profile"):
        if c.exists():
            return str(c)
    found = shutil.which("iree-profile")
    if found is None:
        pytest.skip("iree-profile (pinned iree-base-runtime) not installed")
    return found


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_begin_profiling_writes_a_bundle_upstream_reads(two_matmuls, tmp_path, driver):
    import subprocess

    m = frt.load_vm_flatbuffer_file(str(two_matmuls), driver=driver)
    device = frt.get_device(driver)  # the device load_vm_flatbuffer_file used
    path = tmp_path / "p.ireeprof"
    device.begin_profiling("queue-events,host-execution,memory-events", str(path))
    m.two_matmuls(*_args())
    device.end_profiling()
    out = subprocess.run([_iree_profile(), "dispatch", str(path)], capture_output=True, text=True, check=True).stdout
    assert "host_dispatches: total=2 matched=2 valid=2" in out, out
    assert "two_matmuls_dispatch_1_matmul_32x8x16_f32" in out, out
    with pytest.raises(ValueError, match="requires a profile sink"):
        device.begin_profiling("queue-events")
    with pytest.raises(Exception, match="unknown data family 'bogus'"):
        device.begin_profiling("bogus", str(path))
