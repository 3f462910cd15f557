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
