"""HAL objects: drivers, devices, allocators, buffers, views, enums."""

import numpy as np
import pytest

import ferrite.runtime as rt


def test_drivers_and_devices():
    assert "local-sync" in rt.query_available_drivers()
    assert "local-task" in rt.query_available_drivers()
    assert rt.get_driver("local-task") is rt.get_driver("local-task")
    assert rt.get_device("local-sync") is rt.get_device("local-sync")
    assert repr(rt.get_device("local-sync")) == "local-sync"
    with pytest.raises(ValueError, match=r"^Error creating driver: NOT_FOUND; no driver 'nope' registered$"):
        rt.get_driver("nope")


def test_enum_values_and_arithmetic():
    M = rt.MemoryType
    assert repr(M.DEVICE_LOCAL) == str(M.DEVICE_LOCAL) == "MemoryType.DEVICE_LOCAL"
    assert int(M.DEVICE_LOCAL) == 48 and M.DEVICE_LOCAL.value == 48
    assert M.DEVICE_LOCAL | M.HOST_VISIBLE == 50
    assert type(M.DEVICE_LOCAL | M.HOST_VISIBLE) is int
    assert M.DEVICE_LOCAL != 48
    assert M(48) is M.DEVICE_LOCAL
    with pytest.raises(ValueError):
        M(50)
    assert int(rt.BufferUsage.DEFAULT) == 3075
    assert int(rt.MemoryAccess.ALL) == 7
    assert int(rt.BufferCompatibility.QUEUE_DISPATCH) == 2048
    assert len(rt.HalElementType.__members__) == 32


def test_element_type_helpers():
    E = rt.HalElementType
    assert E.map_to_dtype(E.FLOAT_32) == np.dtype(np.float32)
    assert E.map_to_dtype(E.SINT_8) == np.dtype(np.int8)
    assert not E.is_byte_aligned(E.INT_4)
    assert E.is_byte_aligned(E.FLOAT_16)
    assert E.dense_byte_count(E.FLOAT_64) == 8


def test_buffers_and_views():
    dev = rt.get_device("local-task")
    alloc = dev.allocator
    buf = alloc.allocate_buffer(
        memory_type=rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE,
        allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=16)
    tail = "16 bytes (at offset 0 into 16), memory_type=DEVICE_LOCAL|HOST_VISIBLE, allowed_access=ALL, allowed_usage=TRANSFER|DISPATCH_STORAGE|MAPPING|MAPPING_PERSISTENT"
    assert repr(buf) == f"<HalBuffer {tail}>"
    assert buf.byte_length() == 16
    bv = rt.HalBufferView(buf, [2, 2], rt.HalElementType.FLOAT_32)
    assert repr(bv) == f"<HalBufferView (2, 2), element_type=0x20000021, {tail}>"
    assert bv.shape == [2, 2] and bv.element_type == 553648160 and bv.byte_length == 16
    arr = bv.map().asarray([2, 2], np.float32)
    arr[:] = 3.0
    np.testing.assert_array_equal(bv.map().asarray([2, 2], np.float32), np.full((2, 2), 3.0, np.float32))
    buf.fill_zero(0, 16)
    assert not bv.map().asarray([4], np.float32).any()
    assert bv.ref.deref(rt.HalBufferView) == bv


def test_view_repr_pads_element_type_and_oversized_view_is_out_of_range():
    dev = rt.get_device("local-sync")
    buf = dev.allocator.allocate_buffer(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, allocation_size=16)
    bv = rt.HalBufferView(buf, [2, 2], rt.HalElementType.SINT_8)
    # Upstream prints the element type as eight hex digits.
    assert repr(bv).startswith("<HalBufferView (2, 2), element_type=0x08000011, 16 bytes")
    with pytest.raises(IndexError, match=r"^creating buffer view: OUT_OF_RANGE; buffer view byte length 32 exceeds backing buffer byte length 16"):
        rt.HalBufferView(buf, [2, 2], rt.HalElementType.COMPLEX_64)


def test_allocate_buffer_copy():
    dev = rt.get_device("local-sync")
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = dev.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev, buffer=a)
    assert isinstance(b, rt.HalBuffer) and b.byte_length() == 24
    bv = dev.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev,
        buffer=a, element_type=rt.HalElementType.SINT_32)
    assert bv.shape == [2, 3]
    np.testing.assert_array_equal(bv.map().asarray(bv.shape, np.int32), a)
    with pytest.raises(ValueError, match="ndarray is not C-contiguous"):
        dev.allocator.allocate_buffer_copy(
            memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT, device=dev,
            buffer=np.ones((2, 4), np.int32)[:, ::2], element_type=rt.HalElementType.SINT_32)


def test_create_hal_module_argument_checks():
    inst = rt.VmInstance()
    dev = rt.get_device("local-sync")
    m = rt.create_hal_module(inst, dev)
    assert m.name == "hal" and "buffer_view.create" in m.function_names
    with pytest.raises(ValueError):
        rt.create_hal_module(inst)
    with pytest.raises(ValueError):
        rt.create_hal_module(inst, dev, devices=[dev])
