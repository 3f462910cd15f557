"""The system API, run side by side with the pinned upstream runtime."""

import numpy as np
import pytest

import ferrite.runtime as frt


@pytest.fixture
def arith(compile_program):
    return compile_program("arith")


def _calls():
    rng = np.random.default_rng(0)
    a = rng.standard_normal(4).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    m = rng.integers(-50, 50, (2, 3)).astype(np.int32)
    return [
        ("add", (a, b)),
        ("mul_i32", (6, -7)),
        ("dyn", (np.arange(5, dtype=np.float32),)),
    ]


def _host(v):
    if isinstance(v, tuple):
        return tuple(_host(x) for x in v)
    return v.to_host() if hasattr(v, "to_host") else v


@pytest.mark.parametrize("driver", ["local-sync", "local-task"])
def test_results_match_upstream(arith, upstream, driver):
    ours = frt.load_vm_flatbuffer_file(str(arith), driver=driver)
    theirs = upstream.load_vm_flatbuffer_file(str(arith), driver=driver)
    for name, args in _calls():
        got, want = _host(getattr(ours, name)(*args)), _host(getattr(theirs, name)(*args))
        if isinstance(want, tuple):
            assert isinstance(got, tuple) and len(got) == len(want)
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
                assert g.dtype == w.dtype
        elif isinstance(want, np.ndarray):
            np.testing.assert_array_equal(got, want)
            assert got.dtype == want.dtype
        else:
            assert type(got) is type(want) and got == want


def test_signed_ints_for_signless_tensors_match_upstream(arith, upstream):
    m = np.arange(6, dtype=np.int32).reshape(2, 3)
    args = (m, np.array(3, np.int32))
    want = upstream.load_vm_flatbuffer_file(str(arith), driver="local-sync").scale(*args)
    got = frt.load_vm_flatbuffer_file(str(arith), driver="local-sync").scale(*args)
    assert isinstance(got, tuple) and len(got) == 2
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.to_host(), w.to_host())


def test_bound_module_and_device_array(arith):
    m = frt.load_vm_flatbuffer(arith.read_bytes(), driver="local-sync")
    assert repr(m).startswith("<BoundModule <VmModule module : [add, ")
    assert isinstance(m.add, frt.FunctionInvoker)
    r = m.add(np.ones(4, np.float32), np.ones(4, np.float32))
    assert isinstance(r, frt.DeviceArray)
    assert repr(r) == "<IREE DeviceArray: shape=[4], dtype=float32>"
    assert r.shape == [4]
    np.testing.assert_array_equal(np.asarray(r), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(r + 1, np.full(4, 3, np.float32))
    with pytest.raises(AttributeError):
        m.nope


def test_argument_errors_are_value_errors(arith):
    m = frt.load_vm_flatbuffer_file(str(arith), driver="local-sync")
    with pytest.raises(ValueError, match="^Error invoking function: INVALID_ARGUMENT"):
        m.add(np.arange(3, dtype=np.float32), np.ones(4, np.float32))
    with pytest.raises(ValueError, match="^Error invoking function: INVALID_ARGUMENT"):
        m.add(np.arange(4, dtype=np.int32), np.ones(4, np.float32))


def test_system_context(arith):
    config = frt.Config("local-task")
    ctx = frt.SystemContext(config=config)
    assert list(ctx.modules) == ["hal"]
    ctx.add_vm_module(frt.VmModule.mmap(ctx.instance, str(arith)))
    assert ctx.modules.module.mul_i32(3, 4) == 12
    assert ctx.modules["module"]["mul_i32"](5, 5) == 25


def test_package_exports_upstream_names():
    for name in [
        "VmInstance", "VmModule", "VmContext", "VmFunction", "VmVariantList", "VmRef", "VmBuffer",
        "HalDriver", "HalDevice", "HalAllocator", "HalBuffer", "HalBufferView", "HalElementType",
        "MappedMemory", "MemoryType", "BufferUsage", "MemoryAccess", "BufferCompatibility", "Linkage",
        "create_hal_module", "get_driver", "get_device", "get_first_device", "query_available_drivers",
        "Config", "SystemContext", "BoundModule", "load_vm_flatbuffer", "load_vm_flatbuffer_file",
        "load_vm_module", "load_vm_modules", "FunctionInvoker", "DeviceArray", "asdevicearray",
    ]:
        assert hasattr(frt, name), name
