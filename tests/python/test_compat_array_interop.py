"""DeviceArray behaviours shared with the pinned iree.runtime: explicit vs
implicit host transfer, dtype overrides, ml_dtypes element types, the
staging-copy path."""

import numpy as np
import pytest

import ferrite.runtime as rt


@pytest.fixture(params=["ferrite", "upstream"])
def runtime(request):
    if request.param == "upstream":
        return pytest.importorskip("iree.runtime")
    return rt


@pytest.fixture
def device(runtime):
    return runtime.get_device("local-task")


def test_implicit_transfer_needs_opt_in(runtime, device):
    data = np.arange(12, dtype=np.int32).reshape(3, 4)
    ary = runtime.asdevicearray(device, data)
    assert not ary.is_host_accessible
    with pytest.raises(ValueError, match="cannot be implicitly transferred"):
        np.asarray(ary)
    with pytest.raises(ValueError, match="cannot be implicitly transferred"):
        _ = ary + 1
    np.testing.assert_array_equal(ary.to_host(), data)
    assert ary.is_host_accessible

    implicit = runtime.asdevicearray(device, data, implicit_host_transfer=True)
    np.testing.assert_array_equal(implicit + data, data * 2)
    assert list(np.shape(implicit)) == [3, 4]
    assert np.reshape(implicit, (2, 6)).shape == (2, 6)


def test_override_dtype_converts_values(runtime, device):
    data = np.full((2, 3), 7, np.int32)
    bv = device.allocator.allocate_buffer_copy(
        memory_type=runtime.MemoryType.DEVICE_LOCAL, allowed_usage=runtime.BufferUsage.DEFAULT,
        device=device, buffer=data, element_type=runtime.HalElementType.SINT_32)
    host = runtime.DeviceArray(device, bv, override_dtype=np.float32).to_host()
    assert host.dtype == np.float32
    np.testing.assert_array_equal(host, data.astype(np.float32))


def test_astype_same_dtype_without_copy_is_identity(runtime, device):
    ary = runtime.asdevicearray(device, np.ones(4, np.int32), implicit_host_transfer=True)
    assert ary.astype(np.int32, copy=False) is ary
    assert ary.astype(np.float32).dtype == np.float32


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"])
def test_ml_dtypes_round_trip(runtime, device, name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dtype = np.dtype(getattr(ml_dtypes, name))
    data = np.arange(6, dtype=dtype).reshape(2, 3)
    ary = runtime.asdevicearray(device, data)
    assert ary.dtype == dtype
    host = ary.to_host()
    assert host.dtype == dtype
    np.testing.assert_array_equal(host.view(np.uint8), data.view(np.uint8))


def test_copy_to_host_through_staging(runtime, device):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    ary = runtime.asdevicearray(device, data)
    copied = ary._copy_to_host()
    np.testing.assert_array_equal(copied, data)
    assert not ary.is_host_accessible
