"""External timepoints, external capture, host-allocation import, and the
smaller introspection calls (device info, trace values, module dependency
resolution, file-handle descriptors), compared with iree.runtime where
upstream's CPU drivers can run them."""

import gc
import os
import tempfile

import numpy as np
import pytest

import ferrite.runtime as rt

DRIVERS = ["local-sync", "local-task"]


def as_int(v):
    """An enum member's or a plain int's value (upstream's members reject int())."""
    return int(v.value) if hasattr(v, "value") else int(v)


def test_enums_match_upstream(upstream):
    for name in ("ExternalTimepointType", "ExternalTimepointFlags", "SemaphoreCompatibility"):
        ours, theirs = getattr(rt, name), getattr(upstream, name)
        assert {m: as_int(v) for m, v in ours.__members__.items()} == \
            {m: as_int(v) for m, v in theirs.__members__.items()}
        for m in ours.__members__:
            assert repr(getattr(ours, m)) == repr(getattr(theirs, m))
            assert str(getattr(ours, m)) == str(getattr(theirs, m))
    S = rt.SemaphoreCompatibility
    assert S.HOST_WAIT | S.HOST_SIGNAL == S.HOST_ONLY == 5
    assert S.ALL & S.DEVICE_WAIT == 2
    assert int(S.DEVICE_ONLY) == 10 and S(3) == 3


@pytest.mark.parametrize("driver", DRIVERS)
def test_fresh_timepoint_is_empty(driver):
    tp = rt.HalExternalTimepoint()
    assert (tp.type, tp.flags, tp.compatibility, tp.cuda_event, tp.hip_event) == (0, 0, 0, 0, 0)
    assert tp.type is rt.ExternalTimepointType.NONE
    assert tp.is_reached() is None


@pytest.mark.parametrize("driver", DRIVERS)
def test_export_async_primitive_like_upstream(driver, upstream):
    results = []
    for lib in (rt, upstream):
        sem = lib.get_device(driver).create_semaphore(0)
        tp = lib.HalExternalTimepoint()
        sem.export_timepoint(2, lib.ExternalTimepointType.ASYNC_PRIMITIVE,
                             lib.ExternalTimepointFlags.NONE, tp)
        results.append((as_int(tp.type), as_int(tp.flags), as_int(tp.compatibility)))
    assert results[0] == results[1] == (1, 0, 5)


@pytest.mark.parametrize("driver", DRIVERS)
def test_exported_timepoint_follows_the_semaphore(driver):
    sem = rt.get_device(driver).create_semaphore(0)
    tp = rt.HalExternalTimepoint()
    sem.export_timepoint(2, rt.ExternalTimepointType.ASYNC_PRIMITIVE, 0, tp)
    assert tp.is_reached() is False
    sem.signal(1)
    assert tp.is_reached() is False
    sem.signal(2)
    assert tp.is_reached() is True
    failing = rt.HalExternalTimepoint()
    sem.export_timepoint(3, 1, 0, failing)
    sem.fail("device lost")
    with pytest.raises(RuntimeError, match="device lost"):
        failing.is_reached()


@pytest.mark.parametrize("driver", DRIVERS)
def test_unsupported_exports_and_imports_are_not_implemented(driver, upstream):
    for lib in (rt, upstream):
        sem = lib.get_device(driver).create_semaphore(0)
        tp = lib.HalExternalTimepoint()
        for kind in (lib.ExternalTimepointType.NONE, lib.ExternalTimepointType.CUDA_EVENT,
                     lib.ExternalTimepointType.HIP_EVENT):
            with pytest.raises(NotImplementedError, match=r"^exporting timepoint: .*UNIMPLEMENTED; "):
                sem.export_timepoint(1, kind, 0, tp)
        assert as_int(tp.type) == 0, "a failed export leaves the timepoint as it was"
        with pytest.raises(NotImplementedError, match=r"^importing timepoint: .*UNIMPLEMENTED; "):
            sem.import_timepoint(1, tp)


@pytest.mark.parametrize("driver", DRIVERS)
def test_imported_timepoint_signals_the_importer(driver, upstream):
    for lib in (rt, upstream):
        d = lib.get_device(driver)
        source, target = d.create_semaphore(0), d.create_semaphore(0)
        tp = lib.HalExternalTimepoint()
        source.export_timepoint(3, lib.ExternalTimepointType.ASYNC_PRIMITIVE, 0, tp)
        target.import_timepoint(5, tp)
        assert target.query() == 0
        source.signal(3)
        assert target.wait(5, timeout=5_000_000_000) is not False
        assert target.query() == 5
    d = rt.get_device(driver)
    source, target = d.create_semaphore(0), d.create_semaphore(0)
    tp = rt.HalExternalTimepoint()
    source.export_timepoint(1, 1, 0, tp)
    target.import_timepoint(2, tp)
    source.signal(1)
    assert target.query() == 2
    failing = rt.HalExternalTimepoint()
    source.export_timepoint(4, 1, 0, failing)
    target.import_timepoint(9, failing)
    source.fail("source lost")
    with pytest.raises(RuntimeError, match="source lost"):
        target.query()


@pytest.mark.parametrize("driver", DRIVERS)
def test_external_capture_is_not_implemented(driver, upstream):
    for lib in (rt, upstream):
        d = lib.get_device(driver)
        with pytest.raises(NotImplementedError,
                           match=rf"^starting external device capture: .*UNIMPLEMENTED; "
                                 rf"{driver} external capture not implemented$"):
            d.begin_external_capture("renderdoc", file_path="/tmp/x", label="l")
        with pytest.raises(NotImplementedError,
                           match=rf"^ending external device capture: .*UNIMPLEMENTED; "
                                 rf"{driver} external capture not implemented$"):
            d.end_external_capture()


HOST_VISIBLE = None


@pytest.mark.parametrize("driver", DRIVERS)
def test_import_host_allocation_is_zero_copy(driver):
    d = rt.get_device(driver)
    a = np.arange(16, dtype=np.float32)
    b = d.allocator.import_host_allocation(
        a, rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE, rt.BufferUsage.DEFAULT)
    assert b.byte_length() == 64
    view = b.map().asarray([16], np.float32)
    a[0] = 42.0
    assert view[0] == 42.0, "the buffer aliases the array"
    view[1] = -1.0
    assert a[1] == -1.0
    # The export keeps the array alive after the Python name is gone.
    del a
    gc.collect()
    assert list(view[:3]) == [42.0, -1.0, 2.0]


@pytest.mark.parametrize("driver", DRIVERS)
def test_import_host_allocation_rejects_what_upstream_rejects(driver, upstream):
    mt = rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE
    for lib in (rt, upstream):
        alloc = lib.get_device(driver).allocator
        with pytest.raises(BufferError, match="not writable"):
            alloc.import_host_allocation(b"abc", int(mt), int(lib.BufferUsage.DEFAULT))
        with pytest.raises(TypeError):
            alloc.import_host_allocation(5, int(mt), int(lib.BufferUsage.DEFAULT))
        with pytest.raises((ValueError, BufferError)):
            alloc.import_host_allocation(np.arange(8, dtype=np.float32)[::2], int(mt),
                                         int(lib.BufferUsage.DEFAULT))
        assert alloc.import_host_allocation(bytearray(b"abcd"), int(mt),
                                            int(lib.BufferUsage.DEFAULT)).byte_length() == 4


@pytest.mark.parametrize("driver", DRIVERS)
def test_dump_device_info(driver):
    drv = rt.get_driver(driver)
    info = drv.dump_device_info(drv.query_available_devices()[0]["device_id"])
    assert f"- driver: {driver}" in info and "embedded-elf-x86_64" in info
    with pytest.raises(ValueError, match="NOT_FOUND; .* no device with id 7"):
        drv.dump_device_info(7)


def test_serialized_trace_values_match_upstream(upstream):
    records = []
    for lib in (rt, upstream):
        d = lib.get_device("local-sync")
        view = d.allocator.allocate_buffer_copy(
            memory_type=lib.MemoryType.DEVICE_LOCAL, allowed_usage=lib.BufferUsage.DEFAULT,
            device=d, buffer=np.arange(6, dtype=np.float32).reshape(2, 3),
            element_type=lib.HalElementType.FLOAT_32)
        inner = lib.VmVariantList(2)
        inner.push_int(-4)
        lst = lib.VmVariantList(4)
        lst.push_int(3)
        lst.push_float(2.5)
        lst.push_list(inner)
        lst.push_ref(view.ref)
        records.append([lst.get_serialized_trace_value(i) for i in range(4)])
        with pytest.raises(IndexError):
            lst.get_serialized_trace_value(4)
    # Upstream serializes a buffer view held in a list as null (its variant
    # read loses the ref); ours gives the record its source describes.
    assert records[0][:3] == records[1][:3]
    assert records[0][3]["type"] == "hal.buffer_view"
    assert records[0][3]["shape"] == [2, 3] and records[0][3]["element_type"] == "f32"
    assert np.frombuffer(records[0][3]["contents"], np.float32).tolist() == list(range(6))


def test_module_dependency_resolution_errors_like_upstream(upstream):
    for lib in (rt, upstream):
        for name in ("hal", "nope"):
            with pytest.raises(ValueError, match=rf"^Error resolving module dependency: .*NOT_FOUND; "
                                                 rf"required module '{name}' not available"):
                lib.VmModule.resolve_module_dependency(lib.VmInstance(), name, 0)
    ctx = rt.SystemContext()
    with pytest.raises(ValueError, match="required module 'io_parameters'"):
        ctx.add_module_dependency("io_parameters")


def test_file_handle_descriptor():
    with tempfile.TemporaryFile() as f:
        f.write(b"0123456789abcdef")
        f.flush()
        h = rt.FileHandle.wrap_fd(f.fileno())
        assert h.is_fd and h.fd == f.fileno()
    m = rt.FileHandle.wrap_memory(b"abc")
    assert not m.is_fd and m.fd == -1
