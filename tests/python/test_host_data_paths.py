"""Every way Python host data becomes a HAL buffer or buffer view goes through one
place (crates/ferrite-python/src/host_data.rs): each caller's path is checked here
for what it promises: a copy or the caller's own memory (zero-copy), the shape
and element type of the view, and the errors (beside upstream's where upstream
has the same entry point). FunctionInvoker's zero-copy and copy rules are
checked in detail in test_function_invoker.py."""

import ml_dtypes
import numpy as np
import pytest

import ferrite.runtime as rt

DRIVERS = ["local-sync", "local-task"]


def aligned(n, dtype=np.float32):
    """A C-contiguous, writable 1-d array starting on a 64-byte boundary (what
    device buffers need to be imported)."""
    dtype = np.dtype(dtype)
    raw = np.zeros(n * dtype.itemsize + 64, np.uint8)
    start = (-raw.ctypes.data) % 64
    return raw[start:start + n * dtype.itemsize].view(dtype)


def contents(bv, dtype):
    return bv.map().asarray(list(bv.shape), dtype).copy()


def copy_args(lib, d):
    return dict(memory_type=lib.MemoryType.DEVICE_LOCAL, allowed_usage=lib.BufferUsage.DEFAULT,
                device=d)


@pytest.mark.parametrize("driver", DRIVERS)
def test_allocate_buffer_copy_copies_and_shapes_the_view(driver):
    d = rt.get_device(driver)
    a = aligned(8)
    a[:] = np.arange(8)
    bv = d.allocator.allocate_buffer_copy(buffer=a.reshape(2, 4),
                                          element_type=rt.HalElementType.FLOAT_32,
                                          **copy_args(rt, d))
    assert list(bv.shape) == [2, 4] and bv.element_type == int(rt.HalElementType.FLOAT_32)
    a[0] = 99.0  # a copy: the caller's later writes are not seen
    np.testing.assert_array_equal(contents(bv, np.float32), np.arange(8).reshape(2, 4))
    # Without an element type: a plain buffer of the bytes.
    b = d.allocator.allocate_buffer_copy(buffer=b"abcdef", **copy_args(rt, d))
    assert isinstance(b, rt.HalBuffer) and b.byte_length() == 6
    assert bytes(b.map().asarray([6], np.uint8)) == b"abcdef"


@pytest.mark.parametrize("driver", DRIVERS)
def test_allocate_buffer_copy_reinterprets_formatless_dtypes(driver):
    d = rt.get_device(driver)
    a = np.array([1.0, -2.5, 3.25], ml_dtypes.bfloat16)
    bv = d.allocator.allocate_buffer_copy(buffer=a, element_type=rt.HalElementType.BFLOAT_16,
                                          **copy_args(rt, d))
    assert list(bv.shape) == [3]
    np.testing.assert_array_equal(contents(bv, np.uint16), a.view(np.uint16))


def test_copy_errors_match_upstream(upstream):
    for lib in (rt, upstream):
        d = lib.get_device("local-sync")
        strided = np.arange(8, dtype=np.float32)[::2]
        with pytest.raises(ValueError, match="^ndarray is not C-contiguous$"):
            d.allocator.allocate_buffer_copy(buffer=strided, **copy_args(lib, d))
        with pytest.raises(ValueError, match="^ndarray is not C-contiguous$"):
            d.allocator.allocate_host_staging_buffer_copy(d, strided)
        with pytest.raises(TypeError, match="a bytes-like object is required, not 'int'"):
            d.allocator.allocate_buffer_copy(buffer=5, **copy_args(lib, d))


@pytest.mark.parametrize("driver", DRIVERS)
def test_staging_buffer_is_a_transfer_copy(driver):
    d = rt.get_device(driver)
    a = bytearray(b"12345678")
    s = d.allocator.allocate_host_staging_buffer_copy(d, a)
    a[0:1] = b"x"
    assert s.byte_length() == 8
    assert s.allowed_usage() & int(rt.BufferUsage.TRANSFER)
    assert bytes(s.map().asarray([8], np.uint8)) == b"12345678"


@pytest.mark.parametrize("driver", DRIVERS)
def test_import_host_allocation_aliases_even_unaligned_memory(driver):
    # An explicit import never falls back to a copy (unlike invoker arguments).
    d = rt.get_device(driver)
    raw = aligned(9)
    a = raw[1:]  # 4 bytes past the boundary
    b = d.allocator.import_host_allocation(
        a, rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE, rt.BufferUsage.DEFAULT)
    a[3] = 5.0
    assert b.map().asarray([8], np.float32)[3] == 5.0


@pytest.mark.parametrize("driver", DRIVERS)
def test_dlpack_host_tensors_are_imported_dense_and_copied_strided(driver):
    d = rt.get_device(driver)
    a = np.arange(8, dtype=np.float32)
    bv = d.from_dlpack_capsule(a.__dlpack__())
    assert list(bv.shape) == [8]
    a[1] = 42.0  # dense: the producer's memory itself
    assert contents(bv, np.float32)[1] == 42.0
    s = np.arange(8, dtype=np.int32)[::2]
    bv = d.from_dlpack_capsule(s.__dlpack__())
    assert list(bv.shape) == [4]
    s[0] = -1  # strided: gathered into a copy
    np.testing.assert_array_equal(contents(bv, np.int32), [0, 2, 4, 6])


@pytest.mark.parametrize("driver", DRIVERS)
def test_asdevicearray_takes_lists_scalars_and_arrays(driver):
    d = rt.get_device(driver)
    m = rt.asdevicearray(d, [[1, 2], [3, 4]], dtype=np.int32)
    np.testing.assert_array_equal(m.to_host(), [[1, 2], [3, 4]])
    s = rt.asdevicearray(d, 3.5, dtype=np.float32)
    assert s.to_host().shape == () and s.to_host() == 3.5
    a = np.arange(6, dtype=np.float64).reshape(2, 3)
    c = rt.asdevicearray(d, a)
    a[0, 0] = 9.0  # a copy
    np.testing.assert_array_equal(c.to_host(), np.arange(6).reshape(2, 3))


class ArrayLike:
    """Not a buffer exporter, but numpy can make an array of it."""

    def __array__(self, dtype=None, copy=None):
        return np.array([1.0, 2.0, 3.5], np.float32)


def test_invoker_converts_array_likes_and_names_bad_objects(compile_program, upstream):
    vmfb = str(compile_program("invoker"))
    for lib in (rt, upstream):
        m = lib.load_vm_flatbuffer_file(vmfb, driver="local-sync")
        # Neither a buffer nor a list: through numpy.asarray.
        assert m.sum(ArrayLike()).to_host() == 6.5
        with pytest.raises(ValueError, match="could not convert python value to VM: <object"):
            m.sum(object())
    m = rt.load_vm_flatbuffer_file(vmfb, driver="local-sync")
    with pytest.raises(ValueError, match="^input0: could not convert"):
        m.sum(object())
    with pytest.raises(ValueError, match="could not map dtype dtype\\('>f4'\\) to element type"):
        m.sum(np.arange(3, dtype=">f4"))
