"""The public names of iree.runtime that ferrite.runtime offers, and the
small pieces of system setup that code written for upstream relies on."""

import numpy as np
import pytest

import ferrite.runtime as rt
from ferrite.runtime import _binding, system_setup

def test_every_upstream_name_exists(upstream):
    theirs = {n for n in dir(upstream) if not n.startswith("_")}
    missing = theirs - set(dir(rt))
    assert not missing, sorted(missing)
    for name in ("PyModuleInterface", "Tokenizer", "benchmark_module", "flags", "Shape",
                 "normalize_value", "TARGET_BACKEND_TO_DRIVER", "HalModuleBufferViewTraceCallback"):
        assert hasattr(rt, name), name


def test_every_upstream_class_attribute_exists(upstream):
    missing = []
    for name in dir(upstream):
        theirs = getattr(upstream, name)
        if name.startswith("_") or not isinstance(theirs, type):
            continue
        ours = getattr(rt, name)
        missing += [f"{name}.{a}" for a in dir(theirs)
                    if not a.startswith("_") and not hasattr(ours, a)]
    assert not missing, missing


def test_driver_cache():
    d = _binding.get_cached_hal_driver("local-task")
    assert _binding.get_cached_hal_driver("local-task://") is d
    assert rt.get_driver("local-task") is d
    assert _binding.create_hal_driver("local-task") is not d
    _binding.clear_hal_driver_cache()
    assert _binding.get_cached_hal_driver("local-task") is not d
    with pytest.raises(ValueError, match="NOT_FOUND; no driver 'nope' registered"):
        _binding.get_cached_hal_driver("nope://x")
    assert _binding.disable_leak_checker() is None


def test_first_device_order_and_errors(monkeypatch, upstream):
    for lib in (rt, upstream):
        monkeypatch.setenv("IREE_DEFAULT_DEVICE", "nope, local-sync")
        assert lib.get_first_device(cache=False) is not None
        monkeypatch.delenv("IREE_DEFAULT_DEVICE")
        assert lib.get_first_device(cache=False) is not None  # local-task among the defaults
        with pytest.raises(ValueError, match=r"No device found from list \['nope', 'nada'\]"):
            lib.get_first_device(["nope", "nada"], cache=False)
        assert lib.system_setup.DEFAULT_DRIVER_NAMES == upstream.system_setup.DEFAULT_DRIVER_NAMES
    assert rt.get_device("local-sync") is rt.get_device("local-sync")
    assert rt.get_device("local-sync", cache=False) is not rt.get_device("local-sync")


def test_normalize_value_as_upstream(upstream):
    for value in (None, [1, 2], (3,), {"a": 1}, 7, 2.5, True, np.arange(3), np.float64(1.5)):
        ours, theirs = rt.normalize_value(value), upstream.normalize_value(value)
        if isinstance(theirs, np.ndarray):
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
        else:
            assert ours == theirs
    assert rt.TARGET_BACKEND_TO_DRIVER == upstream.TARGET_BACKEND_TO_DRIVER


def test_driver_create_device_as_upstream(upstream):
    for lib in (rt, upstream):
        driver = lib.get_driver("local-sync")
        (info,) = driver.query_available_devices()
        assert info == {"device_id": 0, "path": "", "name": "default"}
        assert driver.create_device(0) is not None
        assert driver.create_device(info, allocators=["caching", "debug"]) is not None
        with pytest.raises(ValueError, match=r"Device id 5555 not found. Available devices: \[\{'device_id': 0"):
            driver.create_device(5555)
        with pytest.raises(TypeError):
            driver.create_device("zero")
        with pytest.raises(ValueError, match="unrecognized allocator 'bogus'"):
            driver.create_device(0, allocators=["bogus"])
        with pytest.raises(ValueError, match=r"NOT_FOUND; device paths not yet implemented; creating device 'local-sync://1'"):
            lib.get_device("local-sync://1", cache=False)
        assert lib.get_device("local-task://", cache=False) is not None


def test_config_takes_a_list_of_drivers(upstream):
    for lib in (rt, upstream):
        c1 = lib.Config("nothere1,local-sync")
        c2 = lib.Config("nothere1,local-sync")
        assert c1.device is c2.device
        with pytest.raises(ValueError, match="No device found from list"):
            lib.Config("nothere1,nothere2")
        with pytest.raises(ValueError, match="not both"):
            lib.Config("local-sync", device=c1.device)


def test_dtype_infos_as_upstream(upstream):
    from iree.runtime import dtypes as theirs

    from ferrite.runtime import dtypes as ours

    for t in (np.float16, np.float32, np.float64, np.int8, np.uint8, np.int16, np.uint16, np.int32,
              np.uint32, np.int64, np.uint64, np.bool_, np.complex64, np.complex128):
        a, b = ours.map_dtype_to_dtype_info(t), theirs.map_dtype_to_dtype_info(t)
        assert (a.dtype, a.name, a.abi_type, a.hal_type.name) == (b.dtype, b.name, b.abi_type, b.hal_type.name)
        assert (a.is_integer, a.is_signed, a.is_floating_point, a.is_complex) == (
            b.is_integer, b.is_signed, b.is_floating_point, b.is_complex)
        assert ours.map_name_to_dtype_info(a.name).dtype == a.dtype
        assert ours.map_dtype_to_hal_element_type(t).name == theirs.map_dtype_to_hal_element_type(t).name
    for abi in ("f32", "i8", "i64", "i1", "complex<f64>"):
        assert ours.map_abi_type_to_dtype_info(abi).dtype == theirs.map_abi_type_to_dtype_info(abi).dtype
    assert ours.DTYPE_TO_ABI_TYPE == theirs.DTYPE_TO_ABI_TYPE
    assert ours.map_dtype_to_hal_element_type("not a dtype") is None
    assert ours.map_dtype_to_hal_element_type(np.dtype("U3")) is None
    for bad in (lambda: ours.map_name_to_dtype_info("nope"), lambda: ours.map_abi_type_to_dtype_info("q7"),
                lambda: ours.map_dtype_to_dtype_info(np.dtype("U3"))):
        with pytest.raises(KeyError):
            bad()
    ml_dtypes = pytest.importorskip("ml_dtypes")
    assert ours.map_dtype_to_hal_element_type(ml_dtypes.bfloat16) == rt.HalElementType.BFLOAT_16


def test_system_context_dynamic_static_and_loading_rules(compile_program, upstream):
    vmfb = str(compile_program("arith"))
    for lib in (rt, upstream):
        dynamic = lib.SystemContext()
        assert dynamic.is_dynamic and "hal" in dynamic.modules
        module = lib.VmModule.mmap(dynamic.instance, vmfb)
        dynamic.add_vm_module(module)
        with pytest.raises(ValueError, match="duplicate VmModule: 'module'"):
            dynamic.add_vm_module(module)
        static = lib.SystemContext(vm_modules=[lib.VmModule.mmap(dynamic.instance, vmfb)], config=dynamic.config)
        assert not static.is_dynamic
        with pytest.raises(AssertionError):
            static.add_vm_module(module)
        with pytest.raises(ValueError, match="Either 'driver' or 'backend'"):
            lib.load_vm_flatbuffer_file(vmfb)
        with pytest.raises(ValueError, match="Cannot specify both"):
            lib.load_vm_flatbuffer_file(vmfb, driver="local-sync", backend="llvm-cpu")
        assert lib.load_vm_flatbuffer_file(vmfb, backend="llvm-cpu").mul_i32(6, 7) == 42
        released = []
        m = lib.load_vm_flatbuffer_file(vmfb, driver="local-sync", destroy_callback=lambda: released.append(1))
        assert m.mul_i32(2, 3) == 6
        del m
        import gc

        gc.collect()
        assert released == [1]
