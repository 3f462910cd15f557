"""`FunctionInvoker`: calls a VM function with Python values and numpy arrays."""

import numpy as np

from ._binding import (
    BufferUsage,
    HalBufferView,
    MemoryType,
    VmContext,
    VmFunction,
    VmVariantList,
)
from .array_interop import DeviceArray
from . import dtypes

__all__ = ["FunctionInvoker"]


class FunctionInvoker:
    """Calls `vm_function` in `vm_context`, moving numpy inputs to `device`."""

    __slots__ = ["_vm_context", "_device", "_vm_function"]

    def __init__(self, vm_context: VmContext, device, vm_function: VmFunction, tracer=None):
        self._vm_context = vm_context
        self._device = device
        self._vm_function = vm_function

    @property
    def vm_function(self) -> VmFunction:
        return self._vm_function

    def __call__(self, *args, **kwargs):
        if kwargs:
            raise ValueError("keyword arguments are not supported by this function")
        arg_list = VmVariantList(len(args))
        for i, a in enumerate(args):
            self._push(arg_list, a, f"input{i}")
        ret_list = VmVariantList(1)
        self._vm_context.invoke(self._vm_function, arg_list, ret_list)
        results = [self._unpack(ret_list, i) for i in range(len(ret_list))]
        if not results:
            return None
        if len(results) == 1:
            return results[0]
        return tuple(results)

    def _push(self, arg_list: VmVariantList, value, name: str):
        if isinstance(value, DeviceArray):
            arg_list.push_ref(value._buffer_view)
        elif isinstance(value, HalBufferView):
            arg_list.push_ref(value)
        elif isinstance(value, (bool, int, np.integer)):
            arg_list.push_int(int(value))
        elif isinstance(value, (float, np.floating)):
            arg_list.push_float(float(value))
        elif isinstance(value, (list, tuple)):
            sub = VmVariantList(len(value))
            for j, v in enumerate(value):
                self._push(sub, v, f"{name}[{j}]")
            arg_list.push_list(sub)
        elif isinstance(value, dict):
            sub = VmVariantList(len(value))
            for k in sorted(value):
                self._push(sub, value[k], f"{name}[{k!r}]")
            arg_list.push_list(sub)
        elif hasattr(value, "__iree_vm_ref__"):
            arg_list.push_ref(value)
        else:
            try:
                array = np.asarray(value, order="C")  # keeps rank-0 arrays rank 0
                element_type = dtypes.dtype_to_element_type(array.dtype)
            except (TypeError, ValueError) as e:
                raise ValueError(f"{name}: cannot pass a value of type {type(value).__name__}: {e}") from None
            bv = self._device.allocator.allocate_buffer_copy(
                memory_type=MemoryType.DEVICE_LOCAL,
                allowed_usage=BufferUsage.DEFAULT,
                device=self._device,
                buffer=array,
                element_type=element_type,
            )
            arg_list.push_ref(bv)

    def _unpack(self, ret_list: VmVariantList, index: int):
        value = ret_list.get_variant(index)
        if isinstance(value, HalBufferView):
            return DeviceArray(self._device, value, implicit_host_transfer=True)
        if isinstance(value, VmVariantList):
            return [self._unpack(value, j) for j in range(len(value))]
        return value

    def __repr__(self):
        return repr(self._vm_function)
