"""Mistakes a user makes, answered with upstream iree.runtime 3.13's exception
types: each case runs against Ferrite and against the pinned upstream, and
the exception classes must match (where Ferrite deliberately differs, the
test says why and checks Ferrite's behaviour alone)."""

import array
import gc
import json

import numpy as np
import pytest

import ferrite.runtime as rt


def _outcome(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the class is the result
        return type(e).__name__
    return "ok"


def _tokenizer_json():
    # Byte-level BPE with no merges: enough for id handling.
    printable = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    extra, vocab = 0, {}
    for b in range(256):
        if b in printable:
            vocab[chr(b)] = b
        else:
            vocab[chr(256 + extra)] = b
            extra += 1
    return json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": []},
    })


def _cases(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    unknown = tmp_path / "unknown.json"
    unknown.write_text('{"model": {"type": "Nope"}}')
    empty = tmp_path / "empty.json"
    empty.write_text("")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    spec = _tokenizer_json()

    def fence_past_capacity(lib, dev):
        f = lib.HalFence(1)
        for _ in range(2):
            f.insert(dev.create_semaphore(0), 1)

    def extend_past_capacity(lib, dev):
        a, b = lib.HalFence(1), lib.HalFence(1)
        a.insert(dev.create_semaphore(0), 1)
        b.insert(dev.create_semaphore(0), 1)
        a.extend(b)

    def same_semaphore_twice(lib, dev):
        f, s = lib.HalFence(1), dev.create_semaphore(0)
        f.insert(s, 1)
        f.insert(s, 2)
        assert f.timepoint_count == 1

    return {
        "VmVariantList(-1)": lambda lib, dev: lib.VmVariantList(-1),
        "VmVariantList(2**64)": lambda lib, dev: lib.VmVariantList(2**64),
        "VmVariantList(1.5)": lambda lib, dev: lib.VmVariantList(1.5),
        "get_variant(-1)": lambda lib, dev: lib.VmVariantList(1).get_variant(-1),
        "get_variant(5)": lambda lib, dev: lib.VmVariantList(1).get_variant(5),
        "HalFence(-1)": lambda lib, dev: lib.HalFence(-1),
        "HalFence(2**40)": lambda lib, dev: lib.HalFence(2**40),
        "HalFence(65535)": lambda lib, dev: lib.HalFence(65535),
        "HalFence(65534)": lambda lib, dev: lib.HalFence(65534),
        "HalFence(2**64)": lambda lib, dev: lib.HalFence(2**64),
        "fence insert past capacity": fence_past_capacity,
        "fence extend past capacity": extend_past_capacity,
        "fence same semaphore twice": same_semaphore_twice,
        "create_semaphore(-1)": lambda lib, dev: dev.create_semaphore(-1),
        "create_semaphore(2**64)": lambda lib, dev: dev.create_semaphore(2**64),
        "allocate_buffer(-1)": lambda lib, dev: dev.allocator.allocate_buffer(
            lib.MemoryType.DEVICE_LOCAL, lib.BufferUsage.DEFAULT, -1),
        "signal(-1)": lambda lib, dev: dev.create_semaphore(0).signal(-1),
        "signal(2**64)": lambda lib, dev: dev.create_semaphore(0).signal(2**64),
        "wait(-1)": lambda lib, dev: dev.create_semaphore(0).wait(-1, timeout=0),
        "VmModule.mmap missing": lambda lib, dev: lib.VmModule.mmap(lib.VmInstance(), str(tmp_path / "no.vmfb")),
        "VmModule.mmap directory": lambda lib, dev: lib.VmModule.mmap(lib.VmInstance(), str(tmp_path)),
        "load_vm_flatbuffer_file missing": lambda lib, dev: lib.load_vm_flatbuffer_file(
            str(tmp_path / "no.vmfb"), driver="local-sync"),
        "Tokenizer missing file": lambda lib, dev: lib.Tokenizer.from_file(str(tmp_path / "no.json")),
        "Tokenizer bad JSON": lambda lib, dev: lib.Tokenizer.from_file(str(bad)),
        "Tokenizer unknown model": lambda lib, dev: lib.Tokenizer.from_file(str(unknown)),
        "Tokenizer empty file": lambda lib, dev: lib.Tokenizer.from_file(str(empty)),
        "Tokenizer not UTF-8": lambda lib, dev: lib.Tokenizer.from_file(str(binary)),
        "Tokenizer directory": lambda lib, dev: lib.Tokenizer.from_file(str(tmp_path)),
        "Tokenizer bad tiktoken": lambda lib, dev: lib.Tokenizer.from_tiktoken("!!! x", "cl100k_base"),
        "Tokenizer unknown encoding": lambda lib, dev: lib.Tokenizer.from_tiktoken("AA== 0", "nope"),
        "decode([-1])": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode([-1]),
        "decode([2**31])": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode([2**31]),
        "decode([2**64])": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode([2**64]),
        "decode(['a'])": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode(["a"]),
        "id_to_token(2**31)": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).id_to_token(2**31),
        "feed_one(-1)": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode_stream().feed_one(-1),
        "feed_one(2**64)": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).decode_stream().feed_one(2**64),
        "encode(None)": lambda lib, dev: lib.Tokenizer.from_huggingface_json(spec).encode(None),
    }


def test_exception_types_match_upstream(tmp_path, upstream):
    cases = _cases(tmp_path)
    ours_dev, theirs_dev = rt.get_device("local-sync"), upstream.get_device("local-sync")
    diffs = []
    for name, case in cases.items():
        ours = _outcome(lambda: case(rt, ours_dev))
        theirs = _outcome(lambda: case(upstream, theirs_dev))
        if ours != theirs:
            diffs.append(f"{name}: ferrite {ours}, upstream {theirs}")
    assert not diffs, "\n".join(diffs)


def test_exception_types_without_upstream(tmp_path):
    # The same cases, Ferrite alone (what the comparison above pins down).
    dev = rt.get_device("local-sync")
    cases = _cases(tmp_path)
    expect = {
        "VmVariantList(-1)": "TypeError", "HalFence(2**40)": "RuntimeError", "HalFence(65534)": "ok",
        "fence insert past capacity": "RuntimeError", "fence extend past capacity": "RuntimeError",
        "fence same semaphore twice": "ok", "get_variant(-1)": "IndexError",
        "VmModule.mmap missing": "FileNotFoundError", "VmModule.mmap directory": "IsADirectoryError",
        "load_vm_flatbuffer_file missing": "FileNotFoundError", "Tokenizer unknown model": "NotImplementedError",
        "Tokenizer bad JSON": "ValueError", "decode([-1])": "ok", "decode([2**31])": "TypeError",
    }
    for name, want in expect.items():
        assert _outcome(lambda: cases[name](rt, dev)) == want, name


def test_fence_join_of_nothing_is_an_empty_fence(upstream):
    # Deliberately better than upstream, whose join([]) returns a null object
    # that fails on first use ("API object is null"): the join of no fences
    # is an empty fence, already reached.
    f = rt.HalFence.join([])
    assert f.timepoint_count == 0 and f.wait(timeout=0)
    with pytest.raises(ValueError, match="null"):
        upstream.HalFence.join([]).timepoint_count


@pytest.mark.parametrize("make", [
    lambda: b"foobar", lambda: bytearray(b"foobar"), lambda: memoryview(b"xxfoobar")[2:],
    lambda: array.array("b", b"foobar"), lambda: np.frombuffer(b"foobar", dtype=np.uint8),
])
def test_wrap_memory_takes_any_buffer_protocol_object(make):
    fh = rt.FileHandle.wrap_memory(make())
    view = fh.host_allocation  # a property, as upstream
    del fh
    gc.collect()
    assert bytes(view) == b"foobar"
    with pytest.raises(TypeError):
        rt.FileHandle.wrap_memory("not a buffer")


def test_parameter_entry_errors_use_upstream_text():
    index = rt.ParameterIndex()
    index.add_splat("splat", b"\x01", 4)
    index.add_buffer("buffer", b"abcd")
    entries = dict(index.items())
    with pytest.raises(ValueError, match="Entry is not file storage based"):
        entries["splat"].file_storage
    with pytest.raises(ValueError, match="Entry is not splat"):
        entries["buffer"].splat_pattern


def test_python_module_exception_is_the_cause():
    class Methods:
        def __init__(self, iface):
            pass

        def boom(self):
            raise KeyError("from Python")

        def no_results(self, a):
            seen.append(a)

    seen = []
    iface = rt.PyModuleInterface("m", Methods)
    iface.export("boom", "0v", Methods.boom)
    iface.export("no_results", "0i", Methods.no_results)
    m = iface.create()
    ctx = rt.VmContext(rt.VmInstance(), modules=(m,))
    with pytest.raises(RuntimeError, match="KeyError: 'from Python'") as info:
        ctx.invoke(m.lookup_function("boom"), rt.VmVariantList(0), rt.VmVariantList(0))
    assert isinstance(info.value.__cause__, KeyError)
    args, results = rt.VmVariantList(1), rt.VmVariantList(1)
    args.push_int(7)
    ctx.invoke(m.lookup_function("no_results"), args, results)
    assert seen == [7] and results.size == 0
    # A VmFunction does not keep its module alive (as upstream's).
    f = m.lookup_function("boom")
    ctx = m = info = None
    gc.collect()
    assert iface.destroyed and f.name == "boom"
