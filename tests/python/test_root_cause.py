"""Root causes: when queue work fails, the program's waiter (its
`hal.fence.await`) raises with the original status, its message and where it
arose (export, queue operation, device), not a bare ABORTED."""

import numpy as np
import pytest

import ferrite.runtime as frt


@pytest.fixture
def two_matmuls(compile_program):
    return compile_program("two_matmuls")


def _call(path, driver):
    # A device of its own (not the cached one `Config(driver)` would share
    # with other tests), created while the test's environment is in place.
    cfg = frt.Config(device=frt.get_driver(driver).create_default_device())
    ctx = frt.SystemContext(config=cfg)
    ctx.add_vm_module(frt.VmModule.mmap(ctx.instance, str(path)))
    f = ctx.modules.module.two_matmuls
    return cfg.device, f


def _args():
    return (np.ones((32, 64), np.float32), np.ones((64, 16), np.float32), np.ones((16, 8), np.float32))


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_failed_dispatch_names_its_origin(two_matmuls, monkeypatch, driver):
    # Read when the device is created: only this test's device fails.
    monkeypatch.setenv("FERRITE_FAIL_DISPATCH", "*dispatch_1*")
    _, f = _call(two_matmuls, driver)
    with pytest.raises(RuntimeError) as info:
        f(*_args())
    msg = str(info.value)
    for want in (
        "INTERNAL; injected dispatch failure (FERRITE_FAIL_DISPATCH=*dispatch_1*)",
        "dispatch 'two_matmuls_dispatch_1_matmul_32x8x16_f32' (workgroups ",
        "queue execute",
        f"on device '{driver}'",
        "hal.fence.await",
    ):
        assert want in msg, (want, msg)
    assert "ABORTED" not in msg


def test_real_failure_inside_queue_work_reaches_the_waiter(two_matmuls):
    # local-sync: a dispatch bound to a buffer the host still maps is
    # refused while the queue work runs; the fence wait reports why, which
    # binding of which export, and the device.
    device, f = _call(two_matmuls, "local-sync")
    a = frt.asdevicearray(device, np.ones((32, 64), np.float32))
    mapping = a._buffer_view.get_buffer().map()
    with pytest.raises(RuntimeError) as info:
        f(a, *_args()[1:])
    msg = str(info.value)
    for want in (
        "FAILED_PRECONDITION",
        "mapped or accessed by the host",
        "dispatch binding 0 of 'two_matmuls_dispatch_0_matmul_32x16x64_f32'",
        "dispatch 'two_matmuls_dispatch_0_matmul_32x16x64_f32' (workgroups ",
        "on device 'local-sync'",
        "hal.fence.await",
    ):
        assert want in msg, (want, msg)
    del mapping
    out = f(a, *_args()[1:])
    np.testing.assert_array_equal(np.asarray(out.to_host()), np.full((32, 8), 64 * 16, np.float32))
