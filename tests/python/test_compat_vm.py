"""VmModule buffer-loading rules shared with the pinned iree.runtime:
`wrap_buffer` refuses unaligned memory, `from_buffer` copies it with a warning."""

import warnings

import numpy as np
import pytest

import ferrite.runtime as rt

ALIGNMENT = 64


def _placed(data: bytes, misalign: int) -> memoryview:
    """`data` in memory whose address is `misalign` bytes past a 64-byte boundary."""
    store = np.zeros(len(data) + 2 * ALIGNMENT, np.uint8)
    start = (-store.ctypes.data) % ALIGNMENT + misalign
    store[start : start + len(data)] = np.frombuffer(data, np.uint8)
    view = memoryview(store[start : start + len(data)])
    assert (np.frombuffer(view, np.uint8).ctypes.data % ALIGNMENT) == misalign
    return view


@pytest.fixture
def vmfb(compile_program):
    return compile_program("arith").read_bytes()


@pytest.fixture(params=["ferrite", "upstream"])
def runtime(request):
    if request.param == "upstream":
        return pytest.importorskip("iree.runtime")
    return rt


def test_wrap_buffer_refuses_unaligned_memory(runtime, vmfb):
    instance = runtime.VmInstance()
    with pytest.raises(ValueError, match=r"unaligned buffer.*expected alignment 64"):
        runtime.VmModule.wrap_buffer(instance, _placed(vmfb, 1))
    assert runtime.VmModule.wrap_buffer(instance, _placed(vmfb, 0)).name == "module"


@pytest.mark.parametrize("loader", ["from_buffer", "from_flatbuffer"])
def test_unaligned_copy_warns_unless_silenced(runtime, vmfb, loader):
    instance = runtime.VmInstance()
    load = getattr(runtime.VmModule, loader)
    with pytest.warns(UserWarning, match="Making copy of unaligned VmModule buffer"):
        assert load(instance, _placed(vmfb, 8)).name == "module"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(instance, _placed(vmfb, 8), warn_if_copy=False).name == "module"
        assert load(instance, _placed(vmfb, 0)).name == "module"


def test_vm_cast_returns_the_held_object(runtime):
    lst = runtime.VmVariantList(0)
    assert runtime.VmVariantList.__iree_vm_cast__(lst.ref) == lst
    buf = runtime.VmBuffer(8)
    assert runtime.VmBuffer.__iree_vm_cast__(buf.ref) == buf


def test_vm_cast_of_another_type_is_value_error():
    # (upstream crashes here; a clear error is the safe reading.)
    with pytest.raises(ValueError, match="Cannot cast VM ref of type vm.buffer to VmVariantList"):
        rt.VmVariantList.__iree_vm_cast__(rt.VmBuffer(8).ref)


def test_variant_list_shows_fence_timepoint_count(runtime):
    lst = runtime.VmVariantList(1)
    lst.push_ref(runtime.HalFence(2))
    assert str(lst) == "<VmVariantList(1): [fence(0)]>"
