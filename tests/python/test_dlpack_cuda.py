"""DLPack with CUDA memory (kDLCUDA): export of device-local arrays, zero-copy
import of CUDA tensors (PyTorch's when importable), and the errors for
capsules a device cannot take.

The error paths run everywhere. The GPU tests skip, printing why, without a
CUDA device (FERRITE_REQUIRE_GPU=1 turns that skip into a failure, as in
test_cuda.py); the torch tests also skip without torch built with CUDA. The
program run on the GPU is benches/hal/add.mlir: FERRITE_CUDA_ADD_VMFB names
it compiled for cuda, or it is compiled here when iree-compile is present."""

import ctypes
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import ferrite.runtime as rt

from conftest import _compiler

ROOT = Path(__file__).resolve().parents[2]
DL_CPU, DL_CUDA, DL_CUDA_HOST = 1, 2, 3

ctypes.pythonapi.PyCapsule_GetPointer.restype = ctypes.c_void_p
ctypes.pythonapi.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def capsule_tensor(capsule):
    """(data, device_type, device_id, byte_offset) of an unconsumed capsule,
    read from the DLPack structs (DLTensor is first in DLManagedTensor and
    follows version, manager_ctx, deleter and flags in the versioned one)."""
    for name, offset in ((b"dltensor", 0), (b"dltensor_versioned", 32)):
        try:
            p = ctypes.pythonapi.PyCapsule_GetPointer(capsule, name)
        except ValueError:
            continue
        t = p + offset
        data = ctypes.c_uint64.from_address(t).value
        device_type = ctypes.c_int32.from_address(t + 8).value
        device_id = ctypes.c_int32.from_address(t + 12).value
        byte_offset = ctypes.c_uint64.from_address(t + 40).value
        return data, device_type, device_id, byte_offset
    raise AssertionError(f"not an unconsumed DLPack capsule: {capsule!r}")


def data_ptr(array_or_view):
    """The address an export of `array_or_view` points at (stream=-1: no
    ordering needed to read the descriptor)."""
    data, _, _, offset = capsule_tensor(array_or_view.__dlpack__(stream=-1))
    return data + offset


def host_view(device, a):
    return device.allocator.allocate_buffer_copy(
        rt.MemoryType.DEVICE_LOCAL, rt.BufferUsage.DEFAULT, device, a,
        rt.dtypes.dtype_to_element_type(a.dtype))


class Producer:
    """A minimal DLPack producer handing out a prepared capsule."""

    def __init__(self, capsule, device):
        self.capsule, self.device, self.calls = capsule, device, []

    def __dlpack__(self, **kwargs):
        self.calls.append(kwargs)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


# --- error paths: no GPU needed -------------------------------------------


def test_kdlcuda_capsule_on_a_cpu_device_is_a_clear_error():
    dev = rt.get_device("local-sync")
    bv = host_view(dev, np.arange(4, dtype=np.float32))
    cap = dev.create_dlpack_capsule(bv, DL_CUDA, 0)  # labelled kDLCUDA
    assert capsule_tensor(cap)[1:3] == (DL_CUDA, 0)
    with pytest.raises(ValueError, match=r"kDLCUDA, device 0\); HAL device 'local-sync' is not a CUDA device") as e:
        dev.from_dlpack_capsule(cap)
    try:
        rt.get_device("cuda")
        assert "import it through the CUDA device" in str(e.value)
    except Exception:  # no CUDA here: the error says so, with the reason
        assert "no CUDA device" in str(e.value) or "reports no GPU" in str(e.value), str(e.value)


def test_kdlcuda_producer_on_a_cpu_device_is_a_clear_error():
    dev = rt.get_device("local-task")
    bv = host_view(dev, np.arange(4, dtype=np.int32))
    producer = Producer(dev.create_dlpack_capsule(bv, DL_CUDA, 1), (DL_CUDA, 1))
    with pytest.raises(ValueError, match="device 1.*not a CUDA device"):
        dev.from_dlpack_capsule(producer)
    assert "stream" not in producer.calls[0]  # a CPU device orders nothing
    with pytest.raises(ValueError, match="not a CUDA device"):
        rt.asdevicearray(dev, Producer(dev.create_dlpack_capsule(bv, DL_CUDA, 0), (DL_CUDA, 0)))


def test_kdlcuda_argument_to_a_cpu_program_is_a_clear_error(compile_program):
    dev = rt.get_device("local-task")
    ctx = rt.SystemContext(config=rt.Config(device=dev))
    with open(compile_program("arith"), "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    x = np.arange(4, dtype=np.float32)
    fake = Producer(dev.create_dlpack_capsule(host_view(dev, x), DL_CUDA, 0), (DL_CUDA, 0))
    with pytest.raises(ValueError, match="not a CUDA device"):
        ctx.modules.module["add"](fake, x)


def test_other_device_types_are_refused():
    dev = rt.get_device("local-sync")
    bv = host_view(dev, np.arange(4, dtype=np.int32))
    with pytest.raises(ValueError, match="device type 4; Ferrite imports kDLCPU"):
        dev.from_dlpack_capsule(dev.create_dlpack_capsule(bv, 4, 0))  # kDLOpenCL


def test_cuda_host_capsules_are_host_memory():
    dev = rt.get_device("local-sync")
    src = np.arange(6, dtype=np.float32)
    bv = host_view(dev, src)
    back = dev.from_dlpack_capsule(dev.create_dlpack_capsule(bv, DL_CUDA_HOST, 0))
    assert back.map().asarray([6], np.float32).tolist() == src.tolist()


def test_device_array_exports_through_dlpack():
    dev = rt.get_device("local-task")
    arr = rt.asdevicearray(dev, np.arange(6, dtype=np.int32).reshape(2, 3))
    assert arr.__dlpack_device__() == (DL_CPU, 0)
    a = np.from_dlpack(arr)
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert a.ctypes.data == data_ptr(arr)  # the array's memory, not a copy
    with pytest.raises(BufferError, match="kDLCPU"):
        arr.__dlpack__(dl_device=(DL_CUDA, 0))


# --- GPU ------------------------------------------------------------------


def cuda_torch():
    try:
        import torch
    except ImportError as e:
        pytest.skip(f"torch not importable: {e}")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA device (CPU-only build or no GPU)")
    return torch


@pytest.fixture(scope="module")
def add_vmfb(tmp_path_factory):
    path = os.environ.get("FERRITE_CUDA_ADD_VMFB")
    if path:
        return path
    compiler = _compiler()
    if compiler is None:
        pytest.skip("neither FERRITE_CUDA_ADD_VMFB nor iree-compile to build benches/hal/add.mlir for cuda")
    out = tmp_path_factory.mktemp("cuda") / "add.vmfb"
    subprocess.run(
        [compiler, "--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80",
         str(ROOT / "benches/hal/add.mlir"), "-o", str(out)],
        check=True)
    return str(out)


def load_add(dev, vmfb):
    ctx = rt.SystemContext(config=rt.Config(device=dev))
    with open(vmfb, "rb") as f:
        ctx.add_vm_module(rt.VmModule.copy_buffer(ctx.instance, f.read()))
    return ctx.modules.module["add"]


def test_cuda_export_and_reimport_share_memory(cuda_device):
    dev = cuda_device
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    arr = rt.asdevicearray(dev, a)
    assert arr.__dlpack_device__() == (DL_CUDA, 0)
    for stream in (None, 1, 2, -1):  # legacy, per-thread default, none
        data, device_type, device_id, _ = capsule_tensor(arr.__dlpack__(stream=stream))
        assert (device_type, device_id) == (DL_CUDA, 0)
        assert data == data_ptr(arr)
    with pytest.raises(ValueError, match="stream=0 is ambiguous"):
        arr.__dlpack__(stream=0)
    # Ferrite's own consumer: the same device memory, no copy.
    back = dev.from_dlpack_capsule(arr)
    assert data_ptr(back) == data_ptr(arr)
    np.testing.assert_array_equal(rt.DeviceArray(dev, back).to_host(), a)
    # Versioned capsules too; and to the host, as a flagged copy.
    versioned = arr.__dlpack__(max_version=(1, 0))
    assert capsule_tensor(versioned)[0] == data_ptr(arr)
    np.testing.assert_array_equal(rt.DeviceArray(dev, dev.from_dlpack_capsule(versioned)).to_host(), a)
    to_host = arr.__dlpack__(dl_device=(DL_CPU, 0))  # a legacy capsule
    assert capsule_tensor(to_host)[1:3] == (DL_CPU, 0)
    np.testing.assert_array_equal(np.from_dlpack(Producer(to_host, (DL_CPU, 0))), a)
    if np.lib.NumpyVersion(np.__version__) >= "2.1.0":  # from_dlpack(device=...)
        np.testing.assert_array_equal(np.from_dlpack(arr, device="cpu"), a)
    with pytest.raises(BufferError, match="needs a copy"):
        arr.__dlpack__(dl_device=(DL_CPU, 0), copy=False)


def test_cuda_pinned_memory_exports_as_cuda_host(cuda_device):
    dev = cuda_device
    a = np.arange(8, dtype=np.int32)
    arr = rt.asdevicearray(dev, a, memory_type=rt.MemoryType.HOST_LOCAL | rt.MemoryType.DEVICE_VISIBLE)
    assert arr.__dlpack_device__() == (DL_CUDA_HOST, 0)
    host = np.from_dlpack(arr)  # numpy reads kDLCUDAHost memory in place
    assert host.tolist() == a.tolist() and host.ctypes.data == data_ptr(arr)
    # The same memory labelled as host memory, or by its mapped device address.
    assert capsule_tensor(arr.__dlpack__(dl_device=(DL_CPU, 0)))[:3] == (host.ctypes.data, DL_CPU, 0)
    assert capsule_tensor(arr.__dlpack__(dl_device=(DL_CUDA, 0)))[1:3] == (DL_CUDA, 0)
    with pytest.raises(BufferError, match="kDLCUDAHost"):
        arr.__dlpack__(dl_device=(DL_CUDA, 5))
    # Ferrite wraps only device memory as kDLCUDA; pinned memory so labelled
    # is refused with what the driver says it is.
    with pytest.raises(ValueError, match="is host memory, not CUDA device memory"):
        dev.from_dlpack_capsule(arr.__dlpack__(dl_device=(DL_CUDA, 0)))


def test_cuda_import_errors(cuda_device):
    dev = cuda_device
    arr = rt.asdevicearray(dev, np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"on CUDA device 7, but HAL device '.*' is CUDA device 0"):
        dev.from_dlpack_capsule(dev.create_dlpack_capsule(arr._buffer_view, DL_CUDA, 7))
    # Host memory labelled kDLCUDA: the driver does not know the address.
    cpu = rt.get_device("local-sync")
    fake = cpu.create_dlpack_capsule(host_view(cpu, np.arange(4, dtype=np.float32)), DL_CUDA, 0)
    with pytest.raises(ValueError, match="not memory the CUDA driver knows|not CUDA device memory"):
        dev.from_dlpack_capsule(fake)


def test_cuda_program_on_ferrite_memory_without_torch(cuda_device, add_vmfb):
    dev = cuda_device
    add = load_add(dev, add_vmfb)
    x = rt.asdevicearray(dev, np.array([1, 2, 3, 4], np.float32))
    # Imported through DLPack: the program reads the exported memory itself.
    x2 = rt.DeviceArray(dev, dev.from_dlpack_capsule(x))
    assert data_ptr(x2) == data_ptr(x)
    r = add(x2, x2)
    assert r.__dlpack_device__() == (DL_CUDA, 0)
    r2 = rt.DeviceArray(dev, dev.from_dlpack_capsule(r))
    assert data_ptr(r2) == data_ptr(r)
    np.testing.assert_array_equal(r2.to_host(), [2, 4, 6, 8])


def test_torch_cuda_tensor_in_and_out_without_copies(cuda_device, add_vmfb):
    dev = cuda_device
    torch = cuda_torch()
    add = load_add(dev, add_vmfb)
    t = torch.tensor([1, 2, 3, 4], dtype=torch.float32, device="cuda:0")
    u = torch.full((4,), 10.0, dtype=torch.float32, device="cuda:0")
    x = rt.asdevicearray(dev, t)
    y = rt.DeviceArray(dev, dev.from_dlpack_capsule(u))
    assert data_ptr(x) == t.data_ptr() and data_ptr(y) == u.data_ptr()
    r = add(x, y)
    out = torch.from_dlpack(r)
    assert out.device.type == "cuda" and out.data_ptr() == data_ptr(r)
    assert out.tolist() == [11, 12, 13, 14]
    # Torch tensors as arguments: imported in place too.
    assert torch.from_dlpack(add(t, u)).tolist() == [11, 12, 13, 14]
    # Aliasing: torch's writes are what Ferrite reads next (once torch's
    # stream is done: later work on the two streams is not ordered).
    t.mul_(2)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(add(x, y).to_host(), [12, 14, 16, 18])
    # Strided CUDA tensors are refused, not copied.
    m = torch.arange(12, dtype=torch.float32, device="cuda:0").reshape(3, 4)
    with pytest.raises(ValueError, match="strided CUDA dlpack tensors are not supported"):
        dev.from_dlpack_capsule(m[:, ::2])
    # The producer's memory lives while Ferrite uses it, after torch drops it.
    del t
    torch.cuda.empty_cache()
    np.testing.assert_array_equal(x.to_host(), [2, 4, 6, 8])
