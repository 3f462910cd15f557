"""DLPack interchange and HalDeviceLoopBridge (asyncio futures)."""

import asyncio
import gc
import sys
import warnings

import numpy as np
import pytest

import ferrite.runtime as rt


@pytest.fixture(params=["local-sync", "local-task"])
def device(request):
    return rt.get_device(request.param)


def _view(device, array):
    return device.allocator.allocate_buffer_copy(
        rt.MemoryType.DEVICE_LOCAL,
        rt.BufferUsage.DEFAULT,
        device,
        array,
        rt.dtypes.dtype_to_element_type(array.dtype),
    )


def test_export_to_numpy_is_zero_copy(device):
    bv = _view(device, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert bv.__dlpack_device__() == (1, 0)
    a = np.from_dlpack(bv)  # numpy asks for protocol 1.0 (versioned capsule)
    assert a.shape == (2, 3) and a.dtype == np.float32
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    a[0, 0] = 42  # same memory
    assert bv.map().asarray([2, 3], np.float32)[0, 0] == 42
    del bv
    gc.collect()
    assert a[1, 2] == 5  # the capsule keeps the buffer alive


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.int64, np.float16, np.float64, np.bool_, np.complex64])
def test_round_trip_dtypes(device, dtype):
    src = (np.arange(12) % 2 == 1) if dtype == np.bool_ else np.arange(12).astype(dtype)
    src = src.reshape(3, 4)
    bv = device.from_dlpack_capsule(src)
    assert bv.shape == [3, 4]
    back = np.from_dlpack(bv)
    assert back.dtype == src.dtype and np.array_equal(back, src)


def test_import_is_zero_copy_and_keeps_the_producer_alive(device):
    src = np.arange(8, dtype=np.int32)
    bv = device.from_dlpack_capsule(src.__dlpack__())
    src[3] = 99
    assert bv.map().asarray([8], np.int32)[3] == 99
    refs = sys.getrefcount(src)
    del bv
    gc.collect()
    assert sys.getrefcount(src) < refs  # the deleter released numpy's reference


def test_legacy_capsules_both_ways(device):
    bv = _view(device, np.arange(4, dtype=np.float32))
    cap = device.create_dlpack_capsule(bv, 1, 0)
    assert "dltensor" in repr(cap)
    back = device.from_dlpack_capsule(cap)
    assert back.map().asarray([4], np.float32).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="expected an unconsumed DLPack capsule"):
        device.from_dlpack_capsule(cap)  # consumed
    legacy = np.arange(3, dtype=np.int16).__dlpack__()  # no max_version: legacy
    assert device.from_dlpack_capsule(legacy).shape == [3]


def test_strided_and_offset_inputs_are_copied(device):
    base = np.arange(24, dtype=np.float32).reshape(4, 6)
    for src in (base[:, ::2], base.T, base[1:3, 2:5], base[::-1]):
        bv = device.from_dlpack_capsule(src)
        assert bv.shape == list(src.shape)
        assert np.array_equal(bv.map().asarray(src.shape, np.float32), src)


def test_read_only_import_and_errors(device):
    ro = np.arange(4, dtype=np.int32)
    ro.flags.writeable = False
    bv = device.from_dlpack_capsule(ro)
    assert "allowed_access=READ" in repr(bv)
    with pytest.raises(ValueError, match="expected an unconsumed DLPack capsule"):
        device.from_dlpack_capsule(object())
    bv = _view(device, np.zeros(2, np.float32))
    with pytest.raises(BufferError, match="kDLCPU"):
        bv.__dlpack__(dl_device=(2, 0))
    with pytest.raises(BufferError, match="copy=True"):
        bv.__dlpack__(copy=True)


def test_loop_bridge_resolves_futures(device):
    async def main():
        loop = asyncio.get_running_loop()
        bridge = rt.HalDeviceLoopBridge(device, loop)
        try:
            s = device.create_semaphore(0)
            f1 = bridge.on_semaphore(s, 1, "one")
            f2 = bridge.on_semaphore(s, 2, {"two": 2})
            loop.call_later(0.01, s.signal, 1)
            assert await asyncio.wait_for(f1, 10) == "one"
            assert not f2.done()
            s.signal(5)
            assert await asyncio.wait_for(f2, 10) == {"two": 2}
            # Already reached: resolves without another signal.
            assert await asyncio.wait_for(bridge.on_semaphore(s, 3, 3), 10) == 3
            bad = device.create_semaphore(0)
            f3 = bridge.on_semaphore(bad, 1, None)
            bad.fail("device lost")
            with pytest.raises(RuntimeError, match="UNKNOWN; device lost"):
                await asyncio.wait_for(f3, 10)
            pending = bridge.on_semaphore(device.create_semaphore(0), 1, None)
        finally:
            bridge.stop()
        await asyncio.sleep(0.01)
        assert pending.cancelled()
        bridge.stop()  # idempotent
        with pytest.raises(RuntimeError, match="stopped"):
            bridge.on_semaphore(s, 1, None)

    asyncio.run(main())


def test_loop_bridge_deleted_while_running_warns():
    async def main():
        bridge = rt.HalDeviceLoopBridge(rt.get_device("local-task"), asyncio.get_running_loop())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            del bridge
            gc.collect()
        assert any("deleted while running" in str(x.message) for x in w)

    asyncio.run(main())
