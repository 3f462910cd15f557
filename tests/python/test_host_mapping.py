"""HalBuffer.map() follows the HAL's host-access rule (issue 26): a mapping
is refused while queued device work may write the buffer, and device work
is refused while a mapping (or a numpy array viewing it) lives, instead of
racing the Python views."""

import gc

import numpy as np
import pytest

import ferrite.runtime as rt

MS = 1_000_000


def _buffer(device, values):
    b = device.allocator.allocate_buffer(
        rt.MemoryType.DEVICE_LOCAL | rt.MemoryType.HOST_VISIBLE, rt.BufferUsage.DEFAULT, 4 * len(values))
    b.map().asarray([len(values)], np.int32)[:] = values
    gc.collect()
    return b


def test_map_refused_while_queued_work_may_write():
    # local-task queues the command buffer behind a gate it cannot pass
    # yet; its buffers count as in use from submission.
    device = rt.get_device("local-task")
    src = _buffer(device, [1, 2, 3, 4])
    dst = _buffer(device, [0, 0, 0, 0])
    gate = device.create_semaphore(0)
    done = device.create_semaphore(0)
    cb = rt.HalCommandBuffer(device)
    cb.copy(src, dst)
    cb.end()
    device.queue_execute(cb, [(gate, 1)], [(done, 1)])
    with pytest.raises(RuntimeError, match="FAILED_PRECONDITION; buffer is in use by device work"):
        dst.map()
    # The source is only read, but its mapping would be writable (the
    # buffer allows writes): refused too.
    with pytest.raises(RuntimeError, match="FAILED_PRECONDITION; buffer is in use by device work that reads"):
        src.map()
    gate.signal(1)
    assert done.wait(1, timeout=10_000 * MS)
    assert dst.map().asarray([4], np.int32).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_device_work_refused_while_a_mapping_lives(driver):
    device = rt.get_device(driver)
    src = _buffer(device, [5, 6, 7, 8])
    dst = _buffer(device, [9, 9, 9, 9])
    view = dst.map().asarray([4], np.int32)
    # The array keeps the mapping alive after the MappedMemory's name is
    # gone; a copy into the mapped buffer fails its signal instead of
    # writing under the view.
    gc.collect()
    s = device.create_semaphore(0)
    try:
        device.queue_copy(src, dst, [], [(s, 1)])
        with pytest.raises(RuntimeError, match="FAILED_PRECONDITION; buffer is mapped"):
            s.wait(1, timeout=10_000 * MS)
    except RuntimeError as e:  # refused at submission
        assert "FAILED_PRECONDITION; buffer is mapped" in str(e)
    assert view.tolist() == [9, 9, 9, 9], "device work wrote under a live mapping"
    # Reading the mapped buffer on the device is refused too (the mapping
    # is writable), but the source's own mapping is gone: it may be read.
    s2 = device.create_semaphore(0)
    device.queue_copy(dst, src, [], [(s2, 1)])
    with pytest.raises(RuntimeError, match="FAILED_PRECONDITION"):
        s2.wait(1, timeout=10_000 * MS)
    # Once the view is gone the same copy runs.
    del view
    gc.collect()
    s3 = device.create_semaphore(0)
    device.queue_copy(src, dst, [], [(s3, 1)])
    assert s3.wait(1, timeout=10_000 * MS)
    assert dst.map().asarray([4], np.int32).tolist() == [5, 6, 7, 8]


def test_mappings_coexist_and_release():
    device = rt.get_device("local-sync")
    b = _buffer(device, [1, 2, 3, 4])
    m1 = b.map()
    m2 = b.map()
    a1 = m1.asarray([4], np.int32)
    a2 = m2.asarray([4], np.int32)
    a1[0] = 10
    assert a2[0] == 10, "both mappings view the same memory"
    del m1, m2, a1, a2
    gc.collect()
    src = _buffer(device, [3, 3, 3, 3])
    s = device.create_semaphore(0)
    device.queue_copy(src, b, [], [(s, 1)])
    assert s.wait(1, timeout=10_000 * MS)
    assert b.map().asarray([4], np.int32).tolist() == [3, 3, 3, 3]
