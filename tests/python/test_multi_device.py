"""A program compiled for two devices (`tests/collectives/two_devices.mlir`)
run through `ferrite.runtime` with a `hal` module over two devices, as
upstream's Python API does it (`create_hal_module(devices=[...])`): values
cross between the devices inside the program."""

import subprocess

import numpy as np
import pytest

import ferrite.runtime as frt
from conftest import ROOT, _compiler


@pytest.fixture(scope="module")
def two_devices(tmp_path_factory):
    compiler = _compiler()
    if compiler is None:
        pytest.skip("iree-compile (pinned iree-base-compiler) not installed")
    out = tmp_path_factory.mktemp("multi_device") / "two_devices.vmfb"
    subprocess.run(
        [
            compiler,
            "--iree-hal-target-device=dev_a=local",
            "--iree-hal-target-device=dev_b=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=generic",
            str(ROOT / "tests/collectives/two_devices.mlir"),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


@pytest.mark.parametrize("drivers", [("local-task", "local-task"), ("local-sync", "local-task")])
def test_two_devices_in_one_context(two_devices, drivers):
    instance = frt.VmInstance()
    devices = [frt.get_driver(d).create_default_device() for d in drivers]
    hal = frt.create_hal_module(instance, devices=devices)
    module = frt.VmModule.mmap(instance, str(two_devices))
    context = frt.VmContext(instance, modules=[hal, module])

    main = frt.FunctionInvoker(context, devices[0], module.lookup_function("main"))
    a = np.array([1, 2, 3, 4], np.float32)
    b = np.array([10, 20, 30, 40], np.float32)
    np.testing.assert_array_equal(main(a, b).to_host(), a * b + a)

    hops = frt.FunctionInvoker(context, devices[0], module.lookup_function("hops"))
    x = np.arange(8192, dtype=np.float32) * 0.25 - 100
    np.testing.assert_array_equal(hops(x).to_host(), (x * x + x) * 2 - x)
