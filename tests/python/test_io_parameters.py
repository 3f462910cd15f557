"""Parameter I/O against the pinned iree.runtime: indexes built from
buffers and splats, archives written by one runtime and read by the other,
a program fed parameters from .irpa / .safetensors / .gguf through
`create_io_parameters_module`, zero-copy views, and the errors."""

import re
import struct
import subprocess

import numpy as np
import pytest

import ferrite.runtime as rt
from conftest import ROOT, _compiler


@pytest.fixture(scope="module")
def affine(tmp_path_factory):
    """tests/parameters/affine.mlir: y = x * w + b, w and b in scope "model"."""
    compiler = _compiler()
    if compiler is None:
        pytest.skip("iree-compile (pinned iree-base-compiler) not installed")
    out = tmp_path_factory.mktemp("params") / "affine.vmfb"
    subprocess.run(
        [
            compiler,
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            "--iree-llvmcpu-target-cpu=generic",
            str(ROOT / "tests/parameters/affine.mlir"),
            "-o",
            str(out),
        ],
        check=True,
    )
    return out


W = np.array([1.5, -2.0, 0.25, 8.0], np.float32)
B = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
X = np.array([1.0, 2.0, 3.0, 4.0], np.float32)


def _addresses(text):
    return re.sub(r"0x[0-9a-f]+", "0x?", text)


def _sample(lib):
    index = lib.ParameterIndex()
    index.add_buffer("w", W.tobytes())
    index.add_splat("s", np.float32(1.5), 16, metadata="m")
    lib.parameter_index_add_numpy_ndarray(index, "arr", np.arange(6, dtype=np.int16).reshape(2, 3))
    return index


def test_index_matches_upstream(upstream):
    ours, theirs = _sample(rt), _sample(upstream)
    assert len(ours) == len(theirs) == 3
    assert repr(ours) == repr(theirs)
    for (k1, e1), (k2, e2) in zip(ours.items(), theirs.items()):
        assert k1 == k2
        assert _addresses(repr(e1)) == _addresses(repr(e2))
        assert (e1.length, e1.metadata, e1.is_file, e1.is_splat) == (e2.length, e2.metadata, e2.is_file, e2.is_splat)
        if e1.is_splat:
            assert e1.splat_pattern == e2.splat_pattern
        else:
            assert bytes(e1.file_view) == bytes(e2.file_view)
            assert e1.file_storage[1] == e2.file_storage[1]
    arr = rt.parameter_index_entry_as_numpy_ndarray(ours[2])
    assert arr.dtype == np.int16 and arr.shape == (2, 3) and arr[1, 2] == 5
    with pytest.raises(ValueError, match="Expected format version prefix"):
        rt.parameter_index_entry_as_numpy_ndarray(ours[0])
    for lib, index in ((rt, ours), (upstream, theirs)):
        with pytest.raises(IndexError, match="entry 7 out of range"):
            index[7]


def test_archives_cross_runtimes(tmp_path, upstream):
    entries = lambda lib: {
        "a": np.arange(5, dtype=np.float32),
        "z": lib.SplatValue(np.int32(3), [2, 2]),
    }
    for writer, reader in ((rt, upstream), (upstream, rt), (rt, rt)):
        path = tmp_path / f"{writer.__name__}-{reader.__name__}.irpa"
        writer.save_archive_file(entries(writer), path)
        index = reader.ParameterIndex()
        index.load(str(path))
        got = dict(index.items())
        assert set(got) == {"a", "z"}
        assert np.array_equal(
            reader.parameter_index_entry_as_numpy_flat_ndarray(got["a"]).view(np.float32), np.arange(5, dtype=np.float32)
        )
        assert got["z"].is_splat and got["z"].splat_pattern == struct.pack("<i", 3) and got["z"].length == 16
    # create_archive_file returns the index of the written archive.
    back = _sample(rt).create_archive_file(str(tmp_path / "sample.irpa"))
    assert [k for k, _ in back.items()] == ["w", "s", "arr"]
    assert back[0].file_storage[1] % 64 == 0


def _safetensors(path):
    header = b'{"b":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"w":{"dtype":"F32","shape":[4],"data_offsets":[16,32]}}'
    header += b" " * (-len(header) % 8)
    path.write_bytes(struct.pack("<Q", len(header)) + header + B.tobytes() + W.tobytes())


def _gguf(path):
    def string(s):
        return struct.pack("<Q", len(s)) + s.encode()

    f = b"GGUF" + struct.pack("<IQQ", 3, 2, 0)
    for name, offset in (("w", 0), ("b", 32)):
        f += string(name) + struct.pack("<IQIQ", 1, 4, 0, offset)
    f += b"\0" * (-len(f) % 32)
    f += W.tobytes() + b"\0" * 16 + B.tobytes()
    path.write_bytes(f)


def _run(lib, vmfb, index):
    config = lib.Config("local-task")
    provider = index.create_provider(scope="model")
    params = lib.create_io_parameters_module(config.vm_instance, provider)
    program = lib.VmModule.mmap(config.vm_instance, str(vmfb))
    modules = lib.load_vm_modules(params, program, config=config)
    return np.asarray(modules[-1].main(X))


@pytest.mark.parametrize("kind", ["irpa", "safetensors", "gguf", "buffers"])
def test_program_reads_parameters_as_upstream(tmp_path, affine, upstream, kind):
    path = tmp_path / f"p.{kind}"
    if kind == "irpa":
        rt.save_archive_file({"w": W, "b": B}, path)
    elif kind == "safetensors":
        _safetensors(path)
    elif kind == "gguf":
        _gguf(path)
    results = []
    for lib in (rt, upstream):
        index = lib.ParameterIndex()
        if kind == "buffers":
            index.add_buffer("w", W)
            index.add_buffer("b", B)
        else:
            index.load(str(path))
        results.append(_run(lib, affine, index))
    assert np.array_equal(results[0], X * W + B)
    assert np.array_equal(results[0], results[1])


def test_missing_scope_is_an_error(affine):
    config = rt.Config("local-sync")
    params = rt.create_io_parameters_module(config.vm_instance, rt.ParameterIndex().create_provider(scope="other"))
    program = rt.VmModule.mmap(config.vm_instance, str(affine))
    with pytest.raises(ValueError, match="no provider registered that handles scopes like 'model'"):
        rt.load_vm_modules(params, program, config=config)


def test_views_are_not_copies(tmp_path):
    # add_buffer keeps the caller's memory when it is read-only; memory its
    # owner may still write is copied (the index must not change under us).
    w = W.copy()
    w.flags.writeable = False
    index = rt.ParameterIndex()
    index.add_buffer("w", w)
    assert np.shares_memory(np.asarray(index[0].file_view), w)
    w = W.copy()
    index = rt.ParameterIndex()
    index.add_buffer("w", w)
    assert not np.shares_memory(np.asarray(index[0].file_view), w)
    w[0] = 99.0
    assert np.array_equal(np.asarray(index[0].file_view).view(np.float32), W)
    # load() maps the file: entries are views of the one mapping.
    path = tmp_path / "m.irpa"
    rt.save_archive_file({"w": W, "b": B}, path)
    index = rt.ParameterIndex()
    index.load(str(path))
    handle, offset = index[0].file_storage
    whole = np.asarray(handle.host_allocation)
    view = np.asarray(index[0].file_view)
    assert not view.flags.writeable
    assert np.shares_memory(whole, view)
    assert np.array_equal(whole[offset : offset + 16].view(np.float32), W)
    # Preloading reads the file into memory instead.
    pre = rt.ParameterIndex()
    pre.load(str(path), mmap=False)
    assert not np.shares_memory(np.asarray(pre[0].file_storage[0].host_allocation), whole)


def test_errors_match_upstream(tmp_path, upstream):
    bad = tmp_path / "bad.irpa"
    bad.write_bytes(b"IRPA")
    other = tmp_path / "x.bin"
    other.write_bytes(b"1234")
    for lib in (rt, upstream):
        index = lib.ParameterIndex()
        with pytest.raises(ValueError):
            index.load(str(tmp_path / "missing.irpa"))
        with pytest.raises(NotImplementedError):
            index.load(str(other))
        with pytest.raises(Exception):
            index.load(str(bad))
        assert len(index) == 0
    with pytest.raises(ValueError, match="offset 0"):
        rt.ParameterIndex().load(str(bad))


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint16, np.bool_, np.complex64, np.float16])
def test_numpy_metadata_matches_upstream(upstream, dtype):
    array = np.ones((2, 3), dtype=dtype)
    ours, theirs = rt.ParameterIndex(), upstream.ParameterIndex()
    rt.parameter_index_add_numpy_ndarray(ours, "t", array)
    upstream.parameter_index_add_numpy_ndarray(theirs, "t", array)
    assert ours[0].metadata == theirs[0].metadata
    back = rt.parameter_index_entry_as_numpy_ndarray(ours[0])
    assert back.dtype == array.dtype and np.array_equal(back, array)
