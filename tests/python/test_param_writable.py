"""Writable parameter storage: `FileHandle.wrap_memory(..., writable=True)`,
`ParameterIndex.add_buffer(..., writable=True)`, `wrap_fd(..., writable=True)`
and `ParameterIndex.load(..., writable=True)` are scatter targets. A program
calls `io_parameters.scatter`; the bytes land in the Python object or the
file, the same as under the pinned iree.runtime."""

import os
import struct

import numpy as np
import pytest

import ferrite.runtime as rt

SRC = np.array([1.5, -2.0, 0.25], np.float32)


@pytest.fixture(scope="module")
def scatter_vmfb(compile_program):
    return compile_program("param_scatter", "--compile-from=vm")


def _vm_buffer(lib, data):
    b = lib.VmBuffer(len(data), alignment=16, mutable=True)
    memoryview(b)[:] = data
    return b


def scatter(lib, vmfb, index, spans, scope="model"):
    """Scatters SRC through `index` per `spans` [(key, param offset, src offset, length)]."""
    inst = lib.VmInstance()
    dev = lib.get_device("local-sync")
    hal = lib.create_hal_module(inst, dev)
    params = lib.create_io_parameters_module(inst, index.create_provider(scope=scope))
    prog = lib.VmModule.copy_buffer(inst, open(vmfb, "rb").read())
    ctx = lib.VmContext(inst, modules=[hal, params, prog])
    src = dev.allocator.allocate_buffer_copy(
        memory_type=lib.MemoryType.DEVICE_LOCAL, allowed_usage=lib.BufferUsage.DEFAULT,
        device=dev, buffer=SRC)
    table, data, span_bytes = b"", b"", b""
    for key, param_off, src_off, length in spans:
        table += struct.pack("<II", len(data), len(key))
        data += key.encode()
        span_bytes += struct.pack("<QQQ", param_off, src_off, length)
    args = lib.VmVariantList(5)
    for item in (src, _vm_buffer(lib, scope.encode()), _vm_buffer(lib, table),
                 _vm_buffer(lib, data), _vm_buffer(lib, span_bytes)):
        args.push_ref(item)
    rets = lib.VmVariantList(1)
    ctx.invoke(prog.lookup_function("scatter"), args, rets)
    return rets.get_variant(0)


def libs(upstream):
    return [rt] if upstream is None else [rt, upstream]



def test_scatter_into_wrapped_memory_matches_upstream(scatter_vmfb, upstream):
    results = []
    for lib in libs(upstream):
        target = bytearray(16)
        arr = np.zeros(4, np.float32)
        index = lib.ParameterIndex()
        index.add_buffer("b", target, writable=True)
        handle = lib.FileHandle.wrap_memory(arr, writable=True)
        index.add_from_file_handle("a", handle, 16, offset=0)
        assert scatter(lib, scatter_vmfb, index, [("b", 4, 0, 8), ("a", 8, 4, 8)]) == 0
        results.append((bytes(target), arr.tobytes()))
        np.testing.assert_array_equal(np.frombuffer(target, np.float32), [0, 1.5, -2.0, 0])
        np.testing.assert_array_equal(arr, [0, 0, -2.0, 0.25])
    assert len(set(results)) == 1


def test_scatter_into_read_only_memory_fails(scatter_vmfb):
    index = rt.ParameterIndex()
    index.add_buffer("b", bytearray(16))
    with pytest.raises(RuntimeError, match="PERMISSION_DENIED; parameter `b` storage does not support the requested access type"):
        scatter(rt, scatter_vmfb, index, [("b", 0, 0, 4)])


def test_writable_needs_writable_memory():
    # Upstream accepts immutable `bytes` here and would later store into
    # them; Ferrite asks for a writable export and refuses.
    with pytest.raises(BufferError, match="not writable"):
        rt.FileHandle.wrap_memory(b"immutable bytes!", writable=True)
    with pytest.raises(BufferError, match="not writable"):
        rt.ParameterIndex().add_buffer("k", b"immutable bytes!", writable=True)


def test_scatter_out_of_range_changes_nothing(scatter_vmfb):
    target = bytearray(8)
    index = rt.ParameterIndex()
    index.add_buffer("b", target, writable=True)
    with pytest.raises(Exception, match="OUT_OF_RANGE|out of range|outside"):
        scatter(rt, scatter_vmfb, index, [("b", 4, 0, 12)])
    assert target == bytearray(8)


def _archive(lib, path):
    index = lib.ParameterIndex()
    index.add_buffer("w", np.arange(4, dtype=np.float32).tobytes())
    index.create_archive_file(str(path))


def test_scatter_into_loaded_archive_reaches_the_file(tmp_path, scatter_vmfb, upstream):
    path = tmp_path / "w.irpa"
    _archive(rt, path)
    before = path.read_bytes()
    index = rt.ParameterIndex()
    index.load(str(path), writable=True)
    assert scatter(rt, scatter_vmfb, index, [("w", 4, 0, 8)]) == 0
    del index
    after = path.read_bytes()
    # Only parameter w's bytes changed: w = [0, 1.5, -2.0, 3].
    old = np.arange(4, dtype=np.float32).tobytes()
    assert after == before.replace(old, np.array([0, 1.5, -2.0, 3], np.float32).tobytes())
    assert after != before
    if upstream is not None:
        # Upstream's archive entries stay read-only even when the file is
        # opened writable; the same scatter is refused there.
        up_path = tmp_path / "up.irpa"
        _archive(upstream, up_path)
        up = upstream.ParameterIndex()
        up.load(str(up_path), writable=True)
        with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
            scatter(upstream, scatter_vmfb, up, [("w", 4, 0, 8)])


def test_scatter_through_a_writable_fd(tmp_path, scatter_vmfb):
    path = tmp_path / "fd.irpa"
    _archive(rt, path)
    fd = os.open(path, os.O_RDWR)
    try:
        handle = rt.FileHandle.wrap_fd(fd, writable=True)
        index = rt.ParameterIndex()
        index.load_from_file_handle(handle, "irpa")
        assert scatter(rt, scatter_vmfb, index, [("w", 0, 8, 4)]) == 0
    finally:
        os.close(fd)
    assert np.array([0.25, 1, 2, 3], np.float32).tobytes() in path.read_bytes()


def test_writable_preload_is_refused(tmp_path):
    path = tmp_path / "p.irpa"
    _archive(rt, path)
    with pytest.raises(ValueError, match="writable=True needs a memory-mapped file"):
        rt.ParameterIndex().load(str(path), writable=True, mode="preload")
