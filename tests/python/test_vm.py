"""VM objects: instances, modules, functions, contexts, lists, refs, buffers."""

import gc
import threading
import weakref

import numpy as np
import pytest

import ferrite.runtime as rt


@pytest.fixture
def instance():
    return rt.VmInstance()


@pytest.fixture
def arith(compile_program):
    return compile_program("arith")


def test_variant_list_str_matches_upstream_shapes():
    l = rt.VmVariantList(1)
    l.push_int(10000000000)
    assert str(l) == "<VmVariantList(1): [10000000000]>"
    assert repr(l) == str(l)
    l.push_float(1.5)
    l.push_int(-3)
    inner = rt.VmVariantList(1)
    inner.push_int(1)
    l.push_list(inner)
    assert str(l) == "<VmVariantList(4): [10000000000, 1.500000, -3, List[1]]>"
    assert len(l) == 4 and l.size == 4
    assert l.get_variant(0) == 10000000000
    assert l.get_variant(1) == 1.5 and isinstance(l.get_variant(1), float)
    assert str(l.get_as_list(3)) == "<VmVariantList(1): [1]>"


def test_variant_list_errors():
    l = rt.VmVariantList(0)
    l.push_int(1)
    with pytest.raises(IndexError, match=r"^Could not access list element: OUT_OF_RANGE; "):
        l.get_variant(10)
    with pytest.raises(ValueError, match="not a ref"):
        l.get_as_ref(0)
    with pytest.raises(AttributeError):
        l.push_ref(5)


def test_vm_buffer_protocol_and_refs():
    b = rt.VmBuffer(10)
    mv = memoryview(b)
    assert (mv.format, mv.readonly, mv.shape) == ("B", False, (10,))
    mv[3] = 7
    assert repr(b).startswith("<VmBuffer size 10 at 0x")
    assert memoryview(rt.VmBuffer(4, mutable=False)).readonly
    l = rt.VmVariantList(1)
    l.push_ref(b)
    r = l.get_as_ref(0)
    assert r.isinstance(rt.VmBuffer) and not r.isinstance(rt.HalBufferView)
    assert r == b.ref and r.__iree_vm_ref__ is r
    back = r.deref(rt.VmBuffer)
    assert back == b and bytes(memoryview(back))[3] == 7
    assert r.deref(rt.HalBufferView, True) is None
    with pytest.raises(ValueError):
        r.deref(rt.HalBufferView)
    assert repr(r).startswith("<VmRef vm.buffer at 0x")
    assert isinstance(l.get_as_object(0, rt.VmBuffer), rt.VmBuffer)


def test_module_loading_paths(instance, arith):
    data = arith.read_bytes()
    # wrap_buffer takes 64-byte-aligned memory only (test_compat_vm.py).
    store = np.zeros(len(data) + 64, np.uint8)
    start = (-store.ctypes.data) % 64
    store[start : start + len(data)] = np.frombuffer(data, np.uint8)
    aligned = store[start : start + len(data)]
    for m in (
        rt.VmModule.mmap(instance, str(arith)),
        rt.VmModule.from_flatbuffer(instance, data, warn_if_copy=False),
        rt.VmModule.from_buffer(instance, data, warn_if_copy=False),
        rt.VmModule.copy_buffer(instance, data),
        rt.VmModule.wrap_buffer(instance, memoryview(aligned)),
    ):
        assert m.name == "module"
        assert m.function_names[:4] == ["add", "mul_i32", "scale", "dyn"]
        assert repr(m).startswith("<VmModule module : [add, mul_i32, scale, dyn")


def test_bad_module_is_value_error(instance):
    with pytest.raises(ValueError, match=r"^Error creating vm module from aligned memory: INVALID_ARGUMENT; "):
        rt.VmModule.from_flatbuffer(instance, b"garbage" * 10, warn_if_copy=False)


def test_destroy_callback_runs_when_module_freed(instance, arith):
    called = []
    m = rt.VmModule.mmap(instance, str(arith), destroy_callback=lambda: called.append(1))
    del m
    gc.collect()
    assert called == [1]


def test_lookup_function_and_reflection(instance, arith):
    m = rt.VmModule.mmap(instance, str(arith))
    f = m.lookup_function("add")
    assert (f.name, f.module_name, f.linkage) == ("add", "module", int(rt.Linkage.EXPORT))
    decl = "sync func @add(%input0: tensor<4xf32>, %input1: tensor<4xf32>) -> (%output0: tensor<4xf32>)"
    assert f.reflection == {"iree.abi.declaration": decl}
    assert repr(f) == f"<VmFunction add(0rr_r), reflection = {{'iree.abi.declaration': '{decl}'}}>"
    assert m.lookup_function("nope") is None
    assert m.lookup_function("add", rt.Linkage.IMPORT) is None
    assert f.linkage == 2 and {k: v.value for k, v in rt.Linkage.__members__.items()} == {
        "INTERNAL": 0, "IMPORT": 1, "IMPORT_OPTIONAL": 3, "EXPORT": 2, "EXPORT_OPTIONAL": 4}


def test_context_invoke(instance, arith):
    device = rt.get_device("local-sync")
    hal = rt.create_hal_module(instance, device)
    m = rt.VmModule.mmap(instance, str(arith))
    ctx = rt.VmContext(instance)  # dynamic: a context made with modules is static
    ctx.register_modules([hal])
    ctx.register_modules([m])
    assert ctx.context_id >= 1
    args = rt.VmVariantList(2)
    args.push_int(6)
    args.push_int(7)
    rets = rt.VmVariantList(1)
    ctx.invoke(m.lookup_function("mul_i32"), args, rets)
    assert rets.get_variant(0) == 42

    a = np.arange(4, dtype=np.float32)
    bv = device.allocator.allocate_buffer_copy(
        memory_type=rt.MemoryType.DEVICE_LOCAL, allowed_usage=rt.BufferUsage.DEFAULT,
        device=device, buffer=a, element_type=rt.HalElementType.FLOAT_32)
    args = rt.VmVariantList(2)
    args.push_ref(bv)
    args.push_ref(bv)
    assert str(args) == "<VmVariantList(2): [HalBufferView(4:0x20000021), HalBufferView(4:0x20000021)]>"
    rets = rt.VmVariantList(1)
    ctx.invoke(m.lookup_function("add"), args, rets)
    out = rets.get_as_object(0, rt.HalBufferView)
    np.testing.assert_array_equal(out.map().asarray(out.shape, np.float32), a + a)

    with pytest.raises(ValueError, match=r"^Error invoking function: INVALID_ARGUMENT; input list and function mismatch; expected 2 arguments but passed 0"):
        ctx.invoke(m.lookup_function("add"), rt.VmVariantList(0), rt.VmVariantList(1))


def test_objects_are_freed():
    b = rt.VmBuffer(16)
    w = weakref.ref(b) if hasattr(rt.VmBuffer, "__weakref__") else None
    l = rt.VmVariantList(1)
    l.push_ref(b)
    del b, l
    gc.collect()
    if w is not None:
        assert w() is None


def test_two_instances_in_threads(arith):
    results, errors = {}, []

    def work(k):
        try:
            inst = rt.VmInstance()
            hal = rt.create_hal_module(inst, rt.get_device("local-task"))
            m = rt.VmModule.mmap(inst, str(arith))
            ctx = rt.VmContext(inst, modules=[hal, m])
            f = m.lookup_function("mul_i32")
            total = 0
            for i in range(200):
                args = rt.VmVariantList(2)
                args.push_int(i)
                args.push_int(k)
                rets = rt.VmVariantList(1)
                ctx.invoke(f, args, rets)
                total += rets.get_variant(0)
            results[k] = total
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {2: 2 * sum(range(200)), 3: 3 * sum(range(200))}
