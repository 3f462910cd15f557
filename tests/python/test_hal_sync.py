"""Semaphores, fences, command buffers, queue operations and the debug sink.

Where upstream's messages carry a source location (`c/runtime/...:598: `)
ours carry none; everything else is compared with `iree.runtime` as is.
"""

import gc
import re
import subprocess
import threading
import time
import weakref

import numpy as np
import pytest

import ferrite.runtime as rt

from conftest import PROGRAMS, _compiler

try:
    import iree.runtime as upstream
except ImportError:  # pragma: no cover - CI installs the pinned wheels
    upstream = None

MS = 1_000_000


def _strip_location(message):
    return re.sub(r"c/runtime/[^:]+:\d+: ", "", message)


@pytest.fixture(params=["local-sync", "local-task"])
def device(request):
    return rt.get_device(request.param)


@pytest.fixture(scope="module")
def compile_with(tmp_path_factory):
    compiler = _compiler()
    if compiler is None:
        pytest.skip("iree-compile (pinned iree-base-compiler) not installed")
    out_dir = tmp_path_factory.mktemp("vmfb")

    def build(name, *flags):
        out = out_dir / f"{name}.vmfb"
        subprocess.run(
            [
                compiler,
                "--iree-hal-target-device=local",
                "--iree-hal-local-target-device-backends=llvm-cpu",
                "--iree-llvmcpu-target-cpu=generic",
                *flags,
                str(PROGRAMS / f"{name}.mlir"),
                "-o",
                str(out),
            ],
            check=True,
        )
        return out.read_bytes()

    return build


def test_semaphore_signal_query_wait(device):
    s = device.create_semaphore(0)
    assert isinstance(s, rt.HalSemaphore)
    assert s.query() == 0
    assert s.wait(1, timeout=0) is False
    assert s.wait(1, timeout=5 * MS) is False
    assert s.wait(1, deadline=0) is False
    assert s.wait(1, deadline=time.monotonic_ns() + 5 * MS) is False
    s.signal(2)
    assert s.query() == 2
    assert s.wait(1) is True and s.wait(2, timeout=0) is True
    assert s.wait(2, deadline=0) is True
    with pytest.raises(ValueError, match=r"^signaling semaphore: INVALID_ARGUMENT; semaphore already signaled past 1$"):
        s.signal(1)
    with pytest.raises(ValueError, match=r"^timeout and deadline cannot both be set$"):
        s.wait(3, timeout=1, deadline=1)
    assert repr(s) == "<HalSemaphore value=2>"


def test_semaphore_failure_is_sticky(device):
    s = device.create_semaphore(0)
    s.fail("bad sem")
    for call in (lambda: s.wait(0), lambda: s.wait(5, timeout=0)):
        with pytest.raises(RuntimeError, match=r"^synchronous semaphore failure: UNKNOWN; bad sem$"):
            call()
    with pytest.raises(RuntimeError, match=r"^querying semaphore: UNKNOWN; bad sem$"):
        s.query()
    s.signal(5)  # ignored once failed, as upstream
    s.fail("second")
    with pytest.raises(RuntimeError, match="bad sem"):
        s.query()


def _wait_in_thread(wait):
    """Runs `wait` on a thread; returns (thread, results list)."""
    out = []
    t = threading.Thread(target=lambda: out.append(wait()))
    t.start()
    return t, out


def test_semaphore_wait_releases_the_gil(device):
    s = device.create_semaphore(0)
    t, out = _wait_in_thread(lambda: s.wait(3, timeout=10_000 * MS))
    # This thread must be able to run Python while the other one waits.
    time.sleep(0.02)
    assert t.is_alive() and out == []
    s.signal(1)
    time.sleep(0.01)
    assert out == []
    s.signal(3)
    t.join(5)
    assert out == [True]


def test_fence_wait_in_thread_sees_failure(device):
    s = device.create_semaphore(0)
    f = rt.HalFence.create_at(s, 1)
    errors = []

    def waiter():
        try:
            f.wait()
        except RuntimeError as e:
            errors.append(str(e))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.02)
    f.fail("kernel fault")
    t.join(5)
    assert errors == ["synchronous fence failure: UNKNOWN; kernel fault"]


def test_fence_operations(device):
    a = device.create_semaphore(0)
    b = device.create_semaphore(0)
    f = rt.HalFence.create_at(a, 3)
    assert f.timepoint_count == 1
    assert f.wait(timeout=0) is False and f.wait(timeout=MS) is False
    assert f.wait(deadline=0) is False
    empty = rt.HalFence(2)
    assert empty.timepoint_count == 0 and empty.wait() is True
    empty.insert(b, 5)
    empty.insert(b, 3)  # same semaphore: the larger value stays
    assert empty.timepoint_count == 1
    empty.extend(f)
    assert empty.timepoint_count == 2
    assert rt.HalFence.join([f, empty]).timepoint_count == 2
    empty.signal()
    assert (a.query(), b.query()) == (3, 5)
    assert f.wait() is True and empty.wait(timeout=0) is True
    with pytest.raises(ValueError, match=r"^signalling fence: INVALID_ARGUMENT; semaphore already signaled past"):
        empty.signal()
    c = device.create_semaphore(0)
    g = rt.HalFence.create_at(c, 1)
    g.fail("boom")
    with pytest.raises(RuntimeError, match=r"^synchronous fence failure: UNKNOWN; boom$"):
        g.wait()
    with pytest.raises(RuntimeError, match=r"^synchronous fence failure: UNKNOWN; boom$"):
        g.wait(timeout=0)
    with pytest.raises(ValueError, match="timeout and deadline cannot both be set"):
        f.wait(timeout=0, deadline=0)


@pytest.mark.skipif(upstream is None, reason="iree.runtime not installed")
def test_sync_messages_match_upstream():
    def messages(m):
        dev = m.get_device("local-task")
        out = []
        s = dev.create_semaphore(0)
        s.signal(2)
        for call in (
            lambda: s.signal(1),
            lambda: s.wait(3, timeout=1, deadline=1),
        ):
            try:
                call()
            except Exception as e:
                out.append((type(e).__name__, _strip_location(str(e))))
        f = m.HalFence.create_at(dev.create_semaphore(0), 1)
        f.fail("boom")
        for call in (f.wait, lambda: f.wait(timeout=0)):
            try:
                call()
            except Exception as e:
                out.append((type(e).__name__, _strip_location(str(e))))
        s2 = dev.create_semaphore(0)
        out.append((s2.wait(1, timeout=0), m.HalFence.create_at(s2, 1).wait(deadline=0)))
        return out

    assert messages(rt) == messages(upstream)


def test_fences_and_semaphores_are_vm_refs(device):
    s = device.create_semaphore(0)
    f = rt.HalFence.create_at(s, 1)
    lst = rt.VmVariantList(2)
    lst.push_ref(f)
    lst.push_ref(s)
    got = lst.get_as_object(0, rt.HalFence)
    assert isinstance(got, rt.HalFence) and got == f
    assert lst.get_as_object(1, rt.HalSemaphore) == s
    assert f.ref.deref(rt.HalFence) == f
    assert f.ref.isinstance(rt.HalFence) and not f.ref.isinstance(rt.HalBuffer)
    assert repr(f.ref).startswith("<VmRef hal.fence at 0x")
    with pytest.raises(ValueError, match="Cannot cast VM ref of type hal.fence to HalSemaphore"):
        f.ref.deref(rt.HalSemaphore)
    got.signal()
    assert s.query() == 1


def test_objects_are_freed(device):
    s = device.create_semaphore(0)
    f = rt.HalFence.create_at(s, 1)
    cb = rt.HalCommandBuffer(device)
    sink = rt.HalModuleDebugSink(lambda k, v: None)
    refs = [weakref.ref(o) for o in (s, f, cb, sink)]
    del s, f, cb, sink
    gc.collect()
    assert [r() for r in refs] == [None] * 4


def test_debug_sink_cycle_is_collected():
    class Holder:
        pass

    h = Holder()
    h.sink = rt.HalModuleDebugSink(lambda k, v: h)
    r = weakref.ref(h)
    del h
    gc.collect()
    assert r() is None


def _buffers(device):
    a = device.allocator
    b1 = a.allocate_buffer_copy(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, device, np.arange(4, dtype=np.int32))
    b2 = a.allocate_buffer(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, 16)
    b3 = a.allocate_buffer(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, 32)
    return b1, b2, b3


def test_command_buffer_record_and_execute(device):
    b1, b2, b3 = _buffers(device)
    cb = rt.HalCommandBuffer(device)
    with pytest.raises(ValueError, match=r"^If length is not provided, source and target buffer length must match"):
        cb.copy(b1, b3)
    cb.copy(b1, b2)
    cb.copy(b1, b3, target_offset=16, length=8)
    cb.fill(b3, np.array([7], dtype=np.int32), length=16, end=True)
    with pytest.raises(RuntimeError, match=r"^command buffer fill: FAILED_PRECONDITION; command buffer is not in a recording state"):
        cb.fill(b3, np.array([7], dtype=np.int32))
    with pytest.raises(RuntimeError, match=r"^command buffer end: FAILED_PRECONDITION; command buffer is not in a recording state$"):
        cb.end()
    with pytest.raises(RuntimeError, match="re-recording command buffers is not allowed"):
        cb.begin()
    sem = device.create_semaphore(0)
    device.queue_execute(cb, [], [(sem, 1)])
    assert sem.wait(1, timeout=10_000 * MS)
    assert b2.map().asarray([4], np.int32).tolist() == [0, 1, 2, 3]
    assert b3.map().asarray([8], np.int32).tolist() == [7, 7, 7, 7, 0, 1, 0, 0]
    assert cb.ref.deref(rt.HalCommandBuffer) == cb


def test_command_buffer_errors(device):
    _, _, b3 = _buffers(device)
    cb = rt.HalCommandBuffer(device, begin=False)
    with pytest.raises(RuntimeError, match="not in a recording state"):
        cb.fill(b3, np.array([1], dtype=np.int8))
    cb.begin()
    with pytest.raises(RuntimeError, match="already in a recording state"):
        cb.begin()
    with pytest.raises(ValueError, match=r"^command buffer fill: INVALID_ARGUMENT; fill value length is not one of the supported values \(pattern_length=3\)$"):
        cb.fill(b3, np.array([1, 2, 3], dtype=np.int8))
    with pytest.raises(IndexError, match=r"^command buffer fill: OUT_OF_RANGE"):
        cb.fill(b3, np.array([1], dtype=np.int8), target_offset=30, length=8)
    sem = device.create_semaphore(0)
    with pytest.raises(RuntimeError, match=r"^executing command buffers: FAILED_PRECONDITION; command buffer recording has not been ended"):
        device.queue_execute(cb, [], [(sem, 1)])
    assert sem.query() == 0
    with pytest.raises(TypeError, match="wait_semaphores must be a HalFence or a list of"):
        device.queue_execute(cb, 5, [])
    with pytest.raises(TypeError, match=r"wait_semaphores\[0\] must be a \(HalSemaphore, int\) tuple"):
        device.queue_execute(cb, [(sem,)], [])
    with pytest.raises(TypeError, match=r"signal_semaphores\[0\]\[0\] must be a HalSemaphore, got int"):
        device.queue_execute(cb, [], [(1, 2)])


def test_queue_alloca_copy_dealloca(device):
    _, b2, b3 = _buffers(device)
    b2.map().asarray([4], np.int32)[:] = [5, 6, 7, 8]
    s = device.create_semaphore(0)
    buf = device.queue_alloca(64, [], [(s, 1)])
    assert buf.byte_length() == 64
    assert "memory_type=DEVICE_LOCAL|HOST_VISIBLE" in repr(buf)
    device.queue_copy(b2, buf, [(s, 1)], [(s, 2)])
    assert s.wait(2, timeout=10_000 * MS)
    assert buf.map().asarray([4], np.int32).tolist() == [5, 6, 7, 8]
    with pytest.raises(ValueError, match=r"^Source and buffer length must be less than the target buffer length"):
        device.queue_copy(b3, b2, [], [(s, 3)])
    device.queue_dealloca(buf, rt.HalFence.create_at(s, 2), rt.HalFence.create_at(s, 3))
    assert rt.HalFence.create_at(s, 3).wait(timeout=10_000 * MS)


def test_queue_waits_for_a_semaphore_signalled_later():
    # local-task queues the copy; a Python thread signals the wait later.
    device = rt.get_device("local-task")
    _, b2, _ = _buffers(device)
    b2.map().asarray([4], np.int32)[:] = [1, 2, 3, 4]
    target = device.allocator.allocate_buffer(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, 16)
    gate = device.create_semaphore(0)
    done = device.create_semaphore(0)
    device.queue_copy(b2, target, [(gate, 1)], [(done, 1)])
    assert done.wait(1, timeout=10 * MS) is False
    threading.Timer(0.02, lambda: gate.signal(1)).start()
    assert done.wait(1, timeout=10_000 * MS) is True
    assert target.map().asarray([4], np.int32).tolist() == [1, 2, 3, 4]
    # A failed wait fails the signal list instead of running the work.
    gate2 = device.create_semaphore(0)
    done2 = device.create_semaphore(0)
    device.queue_copy(b2, target, [(gate2, 1)], [(done2, 1)])
    gate2.fail("upstream work failed")
    with pytest.raises(RuntimeError, match="upstream work failed"):
        done2.wait(1, timeout=10_000 * MS)


def test_allocator_extras(device):
    a = device.allocator
    staged = a.allocate_host_staging_buffer_copy(device, np.arange(3, dtype=np.float32))
    assert staged.byte_length() == 12
    assert staged.map().asarray([3], np.float32).tolist() == [0.0, 1.0, 2.0]
    with pytest.raises(TypeError):
        a.allocate_host_staging_buffer_copy(device, 5)
    stats = a.statistics
    assert set(stats) == {
        "host_bytes_peak",
        "host_bytes_allocated",
        "host_bytes_freed",
        "device_bytes_peak",
        "device_bytes_allocated",
        "device_bytes_freed",
    }
    assert stats["device_bytes_allocated"] >= 12
    device.begin_profiling()
    device.flush_profiling()
    device.end_profiling()
    with pytest.raises(ValueError, match="requires a profile sink"):
        device.begin_profiling("queue")


@pytest.mark.skipif(upstream is None, reason="iree.runtime not installed")
def test_buffer_compatibility_matches_upstream():
    M, U = rt.MemoryType, rt.BufferUsage
    cases = [
        (M.DEVICE_LOCAL, U.DEFAULT, U.DEFAULT, 1024),
        (M.HOST_LOCAL, U.DEFAULT, U.TRANSFER, 1024),
        (M.DEVICE_LOCAL, U.TRANSFER, U.DISPATCH_STORAGE, 16),
        (0, 0, 0, 0),
    ]
    ours = rt.get_device("local-task").allocator
    theirs = upstream.get_device("local-task").allocator
    for mt, au, iu, size in cases:
        got = ours.query_buffer_compatibility(mt, au, iu, size)
        want = theirs.query_buffer_compatibility(int(mt), int(au), int(iu), size)
        assert got == want, (mt, au, iu, size)


def test_debug_sink_receives_traces(compile_with):
    vmfb = compile_with("trace")
    seen = []

    def callback(key, views):
        seen.append((key, [v.map().asarray(v.shape, np.float32).tolist() for v in views]))

    sink = rt.HalModuleDebugSink(callback)
    assert sink.buffer_view_trace_callback is callback
    inst = rt.VmInstance()
    dev = rt.get_device("local-sync")
    hal = rt.create_hal_module(inst, dev, debug_sink=sink)
    del sink  # the module keeps it alive
    module = rt.VmModule.copy_buffer(inst, vmfb)
    ctx = rt.VmContext(inst, [hal, module])
    f = module.lookup_function("double")
    args = rt.VmVariantList(1)
    args.push_ref(dev.allocator.allocate_buffer_copy(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, dev, np.array([1, 2, 3, 4], np.float32), rt.HalElementType.FLOAT_32))
    ctx.invoke(f, args, rt.VmVariantList(1))
    assert seen == [("input", [[1, 2, 3, 4]]), ("result", [[2, 4, 6, 8]])]


def test_traces_print_to_stderr_without_a_sink(compile_with, capfd, upstream):
    vmfb = compile_with("trace")
    printed = []
    for lib in (rt, upstream):
        inst = lib.VmInstance()
        dev = lib.get_device("local-sync")
        hal = lib.create_hal_module(inst, dev)
        module = lib.VmModule.copy_buffer(inst, vmfb)
        ctx = lib.VmContext(inst, [hal, module])
        args = lib.VmVariantList(1)
        args.push_ref(dev.allocator.allocate_buffer_copy(
            lib.MemoryType.DEVICE_LOCAL, lib.BufferUsage.DEFAULT, dev,
            np.array([1, 2.5, 3, 4], np.float32), lib.HalElementType.FLOAT_32))
        capfd.readouterr()
        ctx.invoke(module.lookup_function("double"), args, lib.VmVariantList(1))
        printed.append(capfd.readouterr().err)
    assert printed[0] == "=== input ===\n4xf32=1 2.5 3 4\n\n=== result ===\n4xf32=2 5 6 8\n\n"
    assert printed[0] == printed[1]


def test_debug_sink_exception_fails_the_call(compile_with):
    vmfb = compile_with("trace")

    def callback(key, views):
        raise KeyError("no tracing today")

    inst = rt.VmInstance()
    dev = rt.get_device("local-sync")
    hal = rt.create_hal_module(inst, dev, debug_sink=rt.HalModuleDebugSink(callback))
    module = rt.VmModule.copy_buffer(inst, vmfb)
    ctx = rt.VmContext(inst, [hal, module])
    args = rt.VmVariantList(1)
    args.push_ref(dev.allocator.allocate_buffer_copy(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, dev, np.zeros(4, np.float32), rt.HalElementType.FLOAT_32))
    with pytest.raises(RuntimeError, match="no tracing today"):
        ctx.invoke(module.lookup_function("double"), args, rt.VmVariantList(1))


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_async_external_function_with_fences(compile_with, driver):
    vmfb = compile_with("async_add", "--iree-execution-model=async-external")
    inst = rt.VmInstance()
    dev = rt.get_device(driver)
    hal = rt.create_hal_module(inst, dev)
    module = rt.VmModule.copy_buffer(inst, vmfb)
    ctx = rt.VmContext(inst, [hal, module])

    def view(values):
        return dev.allocator.allocate_buffer_copy(rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, dev, np.array(values, np.float32), rt.HalElementType.FLOAT_32)

    gate = dev.create_semaphore(0)
    done = dev.create_semaphore(0)
    args = rt.VmVariantList(4)
    args.push_ref(view([1, 2, 3, 4]))
    args.push_ref(view([10, 20, 30, 40]))
    args.push_ref(rt.HalFence.create_at(gate, 1))
    signal = rt.HalFence.create_at(done, 1)
    args.push_ref(signal)
    out = rt.VmVariantList(1)
    # The wait fence is signalled by another thread while invoke blocks (or
    # after it returns, on devices that queue the work).
    threading.Timer(0.05, lambda: gate.signal(1)).start()
    ctx.invoke(module.lookup_function("add"), args, out)
    assert signal.wait(timeout=10_000 * MS) is True
    result = out.get_as_object(0, rt.HalBufferView)
    assert result.map().asarray(result.shape, np.float32).tolist() == [11, 22, 33, 44]
