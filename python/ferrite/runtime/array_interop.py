"""`DeviceArray`: a numpy-compatible view of a device buffer view."""

import numpy as np

from ._binding import BufferUsage, HalBufferView, HalElementType, MemoryType
from . import dtypes

__all__ = ["DeviceArray", "asdevicearray"]


class DeviceArray(np.lib.mixins.NDArrayOperatorsMixin):
    """A buffer view on a device that acts as a numpy array (copied to the host on use)."""

    def __init__(self, device, buffer_view: HalBufferView, implicit_host_transfer: bool = False, override_dtype=None):
        self._device = device
        self._buffer_view = buffer_view
        self._implicit_host_transfer = implicit_host_transfer
        self._override_dtype = override_dtype
        self._host_array = None

    @property
    def shape(self):
        return list(self._buffer_view.shape)

    @property
    def dtype(self):
        if self._override_dtype is not None:
            return np.dtype(self._override_dtype)
        return HalElementType.map_to_dtype(HalElementType(self._buffer_view.element_type))

    def to_host(self) -> np.ndarray:
        if self._host_array is None:
            mapped = self._buffer_view.map()
            self._host_array = mapped.asarray(self._buffer_view.shape, self.dtype)
        return self._host_array

    def __array__(self, dtype=None, copy=None):
        host = self.to_host()
        return host if dtype is None else host.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = [x.to_host() if isinstance(x, DeviceArray) else x for x in inputs]
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __getitem__(self, index):
        return self.to_host()[index]

    def __len__(self):
        return self.shape[0]

    def __iter__(self):
        return iter(self.to_host())

    def astype(self, dtype, casting="unsafe", copy=True):
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


def asdevicearray(device, a, dtype=None, *, implicit_host_transfer: bool = True,
                  memory_type=MemoryType.DEVICE_LOCAL, allowed_usage=BufferUsage.DEFAULT,
                  element_type=None) -> DeviceArray:
    """Copies `a` to `device` as a DeviceArray (a DeviceArray passes through)."""
    if isinstance(a, DeviceArray):
        if dtype is None or np.dtype(dtype) == a.dtype:
            return a
        a = a.to_host()
    # asarray keeps 0-d arrays rank 0 (ascontiguousarray makes them 1-d).
    a = np.asarray(a, dtype=dtype, order="C")
    if element_type is None:
        element_type = dtypes.dtype_to_element_type(a.dtype)
    bv = device.allocator.allocate_buffer_copy(
        memory_type=memory_type, allowed_usage=allowed_usage, device=device,
        buffer=a, element_type=element_type)
    return DeviceArray(device, bv, implicit_host_transfer=implicit_host_transfer)
