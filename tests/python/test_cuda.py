"""CUDA through the Python API: get_driver/get_device("cuda"), a program's
results as device-local DeviceArrays read back with to_host, and a fence
waiting on GPU work. Skips (printing why) without a GPU; FERRITE_REQUIRE_GPU=1
(scripts/test-gpu.sh) turns the skip into a failure."""

import os

import numpy as np
import pytest

import ferrite.runtime as rt

MODULE = os.environ.get("FERRITE_CUDA_ADD_VMFB")


def test_driver_and_device(cuda_device):
    dev = cuda_device
    assert rt.get_driver("cuda") is not None
    assert "cuda" in str(dev) or dev is not None


def test_device_array_round_trip_and_call(cuda_device):
    dev = cuda_device
    a = np.arange(1000, dtype=np.float32)
    arr = rt.asdevicearray(dev, a)
    np.testing.assert_array_equal(arr.to_host(), a)
    if not MODULE:
        pytest.skip("FERRITE_CUDA_ADD_VMFB (bench add compiled for cuda) not set")
    config = rt.Config(device=dev)
    ctx = rt.SystemContext(config=config)
    with open(MODULE, "rb") as f:
        vm_module = rt.VmModule.copy_buffer(ctx.instance, f.read())
    ctx.add_vm_module(vm_module)
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    y = np.array([10, 10, 10, 10], dtype=np.float32)
    r = ctx.modules.module["add"](x, y)
    np.testing.assert_array_equal(r.to_host(), x + y)


def test_begin_profiling_on_cuda_writes_a_bundle_upstream_reads(cuda_device, tmp_path):
    """`HalDevice.begin_profiling`/`end_profiling` on cuda: a bundle with
    device-timestamped dispatches, device queue events and the block
    pool's memory events, read by upstream's `iree-profile`."""
    import subprocess
    from pathlib import Path

    if not MODULE:
        pytest.skip("FERRITE_CUDA_ADD_VMFB (bench add compiled for cuda) not set")
    upstream_bin = os.environ.get("UPSTREAM_BIN")
    tool = Path(upstream_bin or "") / "iree-profile"
    if not upstream_bin or not tool.exists():
        if os.environ.get("FERRITE_REQUIRE_GPU") == "1":
            raise RuntimeError("UPSTREAM_BIN (upstream's iree-profile) is needed with FERRITE_REQUIRE_GPU=1")
        pytest.skip("UPSTREAM_BIN/iree-profile (pinned iree-base-runtime) not available")
    dev = cuda_device
    ctx = rt.SystemContext(config=rt.Config(device=dev))
    with open(MODULE, "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    path = tmp_path / "cuda.ireeprof"
    dev.begin_profiling("queue-events,dispatch-events,device-queue-events,memory-events", str(path))
    x = np.array([1, 2, 3, 4], dtype=np.float32)
    for _ in range(3):
        r = ctx.modules.module["add"](x, x)
    dev.end_profiling()
    np.testing.assert_array_equal(r.to_host(), x + x)
    run = lambda cmd: subprocess.run([str(tool), cmd, str(path)], capture_output=True, text=True, check=True).stdout
    dispatch = run("dispatch")
    assert "dispatches: total=3 matched=3 valid=3 invalid=0" in dispatch, dispatch
    queue = run("queue")
    assert "device_event" in queue and "valid=true" in queue, queue
    import re

    memory = run("memory")
    pool = re.search(r"pool_reserve/materialize/release/wait=(\d+)/(\d+)/(\d+)/(\d+)", memory)
    assert pool, memory
    reserve, materialize, release, _ = map(int, pool.groups())
    # Each call's result block is reserved from the pool and materialized.
    assert reserve >= 3 and materialize == reserve and release >= 1, memory
