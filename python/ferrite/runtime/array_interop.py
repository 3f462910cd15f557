"""`DeviceArray`: a numpy-compatible view of a device buffer view."""

import numpy as np

from ._binding import BufferUsage, HalBufferView, HalElementType, HalFence, MemoryType
from . import dtypes

__all__ = ["DeviceArray", "asdevicearray"]


class DeviceArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A buffer view on a device that acts as a numpy array.

    Data is reached through `to_host()`; numpy conversions and ufuncs reach it
    implicitly only when the array was made with `implicit_host_transfer=True`,
    so an accidental device-to-host copy is an error rather than a slowdown.
    """

    def __init__(self, device, buffer_view: HalBufferView, implicit_host_transfer: bool = False, override_dtype=None):
        self._device = device
        self._buffer_view = buffer_view
        self._implicit_host_transfer = implicit_host_transfer
        self._override_dtype = override_dtype
        self._mapped_memory = None
        self._host_array = None

    @property
    def shape(self):
        return list(self._buffer_view.shape)

    @property
    def dtype(self):
        if self._override_dtype is not None:
            return np.dtype(self._override_dtype)
        return self._raw_dtype()

    @property
    def is_host_accessible(self) -> bool:
        """Whether the data has been brought to the host (mapped)."""
        return self._host_array is not None

    def _raw_dtype(self):
        return np.dtype(HalElementType.map_to_dtype(HalElementType(self._buffer_view.element_type)))

    def _as_requested_dtype(self, raw: np.ndarray) -> np.ndarray:
        # An override is a value conversion (e.g. bool stored as i8), not a
        # reinterpretation of the bytes.
        if self._override_dtype is not None and np.dtype(self._override_dtype) != raw.dtype:
            return raw.astype(self._override_dtype)
        return raw

    def _is_mappable(self) -> bool:
        buffer = self._buffer_view.get_buffer()
        visible = int(MemoryType.HOST_VISIBLE)
        scoped = int(BufferUsage.MAPPING_SCOPED)
        return (buffer.memory_type() & visible) == visible and (buffer.allowed_usage() & scoped) == scoped

    def _transfer_to_host(self, implicit: bool) -> np.ndarray:
        if implicit and not self._implicit_host_transfer:
            raise ValueError(
                "DeviceArray cannot be implicitly transferred to the host: "
                "if necessary, do an explicit transfer via .to_host()")
        if not self._is_mappable():
            return self._copy_to_host()
        if self._host_array is None:
            self._mapped_memory = self._buffer_view.map()
            raw = _mapped_array(self._mapped_memory, self._buffer_view.shape, self._raw_dtype())
            self._host_array = self._as_requested_dtype(raw)
        return self._host_array

    def _copy_to_host(self) -> np.ndarray:
        """Copies the data through a host staging buffer with a device queue copy."""
        source = self._buffer_view.get_buffer()
        staging = self._device.allocator.allocate_buffer(
            memory_type=int(MemoryType.HOST_LOCAL | MemoryType.DEVICE_VISIBLE),
            allowed_usage=int(BufferUsage.TRANSFER_TARGET | BufferUsage.MAPPING_SCOPED),
            allocation_size=source.byte_length())
        semaphore = self._device.create_semaphore(0)
        self._device.queue_copy(
            source, staging,
            wait_semaphores=HalFence.create_at(semaphore, 0),
            signal_semaphores=HalFence.create_at(semaphore, 1))
        HalFence.create_at(semaphore, 1).wait()
        raw = _mapped_array(staging.map(), self._buffer_view.shape, self._raw_dtype())
        return self._as_requested_dtype(np.array(raw))

    def to_host(self) -> np.ndarray:
        return self._transfer_to_host(False)

    def __array__(self, dtype=None, copy=None):
        host = self._transfer_to_host(True)
        return host if dtype is None else host.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        def host(x):
            return x._transfer_to_host(True) if isinstance(x, DeviceArray) else x

        inputs = [host(x) for x in inputs]
        if kwargs.get("out") is not None:
            kwargs = dict(kwargs, out=tuple(host(x) for x in kwargs["out"]))
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        if func is np.shape:
            return self._buffer_view.shape
        args = [a.to_host() if isinstance(a, DeviceArray) else a for a in args]
        return func(*args, **kwargs)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack export of the buffer view (no copy): device memory stays on
        the device (`torch.from_dlpack(array)` gives a CUDA tensor over the
        same memory for a CUDA device's array). The capsule carries the stored
        element type (an `override_dtype` is a host-side conversion)."""
        return self._buffer_view.__dlpack__(
            stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self):
        return self._buffer_view.__dlpack_device__()

    def __getitem__(self, index):
        return self.to_host()[index]

    def __len__(self):
        return self.shape[0]

    def __iter__(self):
        return iter(self.to_host())

    def astype(self, dtype, casting="unsafe", copy=True):
        if not copy and self.dtype == np.dtype(dtype):
            return self
        return self.to_host().astype(dtype, casting=casting, copy=copy)

    def reshape(self, *shape):
        return self.to_host().reshape(*shape)

    def tolist(self):
        return self.to_host().tolist()

    def __reduce__(self):
        return (np.asarray, (np.array(self.to_host()),))

    def __deepcopy__(self, memo):
        return np.array(self.to_host())

    def __repr__(self):
        return f"<IREE DeviceArray: shape={self.shape}, dtype={self.dtype}>"

    def __str__(self):
        return str(self.to_host())


_DL_CUDA = 2


def _is_cuda_tensor(a) -> bool:
    """Whether `a` reports CUDA device memory through DLPack."""
    device = getattr(a, "__dlpack_device__", None)
    if device is None or isinstance(a, np.ndarray):
        return False
    try:
        return device()[0] == _DL_CUDA
    except Exception:
        return False


def _mapped_array(mapped, shape, dtype) -> np.ndarray:
    """`mapped` as an array of `dtype`; types numpy cannot export through the
    buffer protocol (ml_dtypes' bfloat16, float8) are read as same-width
    unsigned integers and reinterpreted."""
    if _needs_integer_view(dtype):
        return mapped.asarray(shape, np.dtype(f"u{dtype.itemsize}")).view(dtype)
    return mapped.asarray(shape, dtype)


def _needs_integer_view(dtype) -> bool:
    return dtype.kind == "V" or dtype.char not in np.typecodes["All"]


def _exportable(a: np.ndarray) -> np.ndarray:
    """`a`, viewed as same-width unsigned integers when numpy cannot export its dtype."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}")) if _needs_integer_view(a.dtype) else a


def asdevicearray(device, a, dtype=None, *, implicit_host_transfer: bool = False,
                  memory_type=MemoryType.DEVICE_LOCAL, allowed_usage=BufferUsage.DEFAULT,
                  element_type=None) -> DeviceArray:
    """Copies `a` to `device` as a DeviceArray (a DeviceArray passes through).

    A CUDA tensor (any object whose `__dlpack_device__` is kDLCUDA, e.g. a
    PyTorch CUDA tensor) is not copied: it is imported through DLPack onto
    `device`, which must be the CUDA device of its ordinal, and the
    DeviceArray uses the tensor's memory."""
    if isinstance(a, DeviceArray):
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        a = a.to_host()
    if dtype is None and element_type is None and _is_cuda_tensor(a):
        bv = device.from_dlpack_capsule(a)
        return DeviceArray(device, bv, implicit_host_transfer=implicit_host_transfer)
    # asarray keeps 0-d arrays rank 0 (ascontiguousarray makes them 1-d).
    a = np.asarray(a, dtype=dtype, order="C")
    if element_type is None:
        element_type = dtypes.dtype_to_element_type(a.dtype)
    bv = device.allocator.allocate_buffer_copy(
        memory_type=memory_type, allowed_usage=allowed_usage, device=device,
        buffer=_exportable(a), element_type=element_type)
    return DeviceArray(device, bv, implicit_host_transfer=implicit_host_transfer, override_dtype=a.dtype)
