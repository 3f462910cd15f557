"""Argument packing: Python values into the `VmVariantList` a function is
invoked with, following the legacy `iree.abi` descriptors of its arguments
or, with none, the Python types alone (dynamic mode).

`ArgumentPacker` and `InvokeContext` have the names and signatures of
upstream's native classes of the same names; `ReflectionInvoker` is built on
them.
"""

import reprlib
from typing import Any, Callable, Optional

import numpy as np

from ._binding import BufferUsage, HalBufferView, MemoryType, VmVariantList
from .array_interop import DeviceArray, _is_cuda_tensor
from .dtypes import map_dtype_to_hal_element_type

__all__ = ["ArgumentError", "ArgumentPacker", "InvokeContext"]

# Memory type and usage of the device buffers an invoker allocates for host
# arrays it does not import in place (upstream exposes the same two names).
IMPLICIT_BUFFER_ARG_MEMORY_TYPE = MemoryType.DEVICE_LOCAL
IMPLICIT_BUFFER_ARG_USAGE = BufferUsage.DEFAULT


class ArgumentError(ValueError):
    """A Python value could not be passed as a function argument."""


class InvokeContext:
    """What packing needs of a call: the device host arrays are copied to."""

    __slots__ = ["device"]

    def __init__(self, device):
        self.device = device


class _InvokeStatics:
    """Upstream keeps process-wide lookup tables in this object; ours are
    module globals, so it only stands in for the argument."""


_invoke_statics = _InvokeStatics()

# A packer appends the VM value of one Python value to a VmVariantList.
_Packer = Callable[[InvokeContext, VmVariantList, Any], None]


class ArgumentPacker:
    """Packs a call's positional and keyword arguments into a `VmVariantList`.

    `arg_descs` is the `"a"` list of the `iree.abi` reflection: one descriptor
    per argument, `["named", name, desc]` for one that may be passed by
    keyword (and must be, past the positional ones). None packs by Python
    type alone and takes no keyword arguments.
    """

    __slots__ = ["_packers", "_positional_count", "_kwarg_index"]

    def __init__(self, statics=None, arg_descs=None):
        del statics  # upstream's lookup tables; see `_InvokeStatics`
        self._packers: Optional[list] = None
        self._positional_count = 0
        self._kwarg_index: dict = {}
        if arg_descs is not None:
            self._packers = []
            for desc in arg_descs:
                if isinstance(desc, list) and desc and desc[0] == "named":
                    self._kwarg_index[desc[1]] = len(self._packers)
                    desc = desc[2]
                else:
                    self._positional_count += 1
                self._packers.append((_packer_for(desc), desc))

    def pack(self, invoke_context: InvokeContext, pos_args, kw_args) -> VmVariantList:
        """The argument list of one call; ArgumentError when the arguments do
        not fit the descriptors."""
        if self._packers is None:
            if kw_args:
                raise ArgumentError("kwargs not supported for dynamic dispatch functions")
            arg_list = VmVariantList(len(pos_args))
            for arg in pos_args:
                packer = _generic_packer(arg)
                if packer is None:
                    raise _argument_error(f"could not convert python value to VM: {_shown(arg)}", arg, None)
                _run_packer(invoke_context, packer, arg_list, arg, None)
            return arg_list

        if len(pos_args) > self._positional_count:
            raise ArgumentError(
                f"mismatched call arity: expected {self._positional_count} got {len(pos_args)}"
            )
        values = list(pos_args) + [_MISSING] * (len(self._packers) - len(pos_args))
        for name, value in kw_args.items():
            index = self._kwarg_index.get(name)
            if index is None:
                raise ArgumentError(f"specified kwarg '{name}' is unknown")
            if values[index] is not _MISSING:
                raise ArgumentError(f"mismatched call arity: duplicate keyword argument '{name}'")
            values[index] = value
        for i, value in enumerate(values):
            if value is _MISSING:
                raise ArgumentError(f"mismatched call arity: expected a value for argument {i}")
        arg_list = VmVariantList(len(values))
        for (packer, desc), value in zip(self._packers, values):
            _run_packer(invoke_context, packer, arg_list, value, desc)
        return arg_list


_MISSING = object()


def _run_packer(context: InvokeContext, packer: _Packer, arg_list: VmVariantList, value, desc) -> None:
    """Runs a top-level packer; a failure names the argument it was packing."""
    try:
        packer(context, arg_list, value)
    except ArgumentError:
        raise
    except _PackError as e:
        raise _argument_error(str(e), value, desc) from e.__cause__
    except Exception as e:
        raise _argument_error(f"{type(e).__name__}: {e}", value, desc) from e


def _argument_error(summary: str, arg, desc) -> ArgumentError:
    if isinstance(arg, np.ndarray):
        shown = f"ndarray({arg.shape}, {arg.dtype})"
    else:
        shown = _shown(arg)
    return ArgumentError(
        f"Error passing argument: {summary} (while encoding argument {shown!r} with description {desc})"
    )


# How much of an argument a message shows. Small values print as `repr`
# prints them (upstream's messages); a large one, such as a 1000x16 list
# (82,054 characters as a repr), prints as its nested lengths, the type of
# its first item and the first few items at each level.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 4, 4, 4, 4
_REPR.maxstring, _REPR.maxother, _REPR.maxlong = 60, 60, 40
_MAX_SHOWN = 200
_MAX_SMALL_ITEMS = 64


def _is_small(value) -> bool:
    """True when `value` holds at most `_MAX_SMALL_ITEMS` items in all and
    no long string, so that its repr is short."""
    stack, seen = [value], 0
    while stack:
        v = stack.pop()
        seen += 1
        if seen > _MAX_SMALL_ITEMS:
            return False
        if isinstance(v, (list, tuple, set, frozenset)):
            if len(v) > _MAX_SMALL_ITEMS:
                return False
            stack.extend(v)
        elif isinstance(v, dict):
            if len(v) > _MAX_SMALL_ITEMS:
                return False
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, (str, bytes, bytearray)) and len(v) > _MAX_SHOWN:
            return False
    return True


def _shown(value) -> str:
    """`value` for an error message, bounded whatever its size."""
    try:
        if _is_small(value):
            text = repr(value)
        else:
            text = _REPR.repr(value)
            if isinstance(value, (list, tuple)):
                dims, item = [], value
                while isinstance(item, (list, tuple)) and len(dims) < 32:
                    dims.append(len(item))
                    if not item:
                        break
                    item = item[0]
                leaf = "" if isinstance(item, (list, tuple)) else f" of {type(item).__name__}"
                text = f"{type(value).__name__} {'x'.join(map(str, dims))}{leaf} {text}"
    except Exception:  # a repr that fails must not hide the error
        text = f"<{type(value).__name__} object>"
    if len(text) > 2 * _MAX_SHOWN:
        text = text[: 2 * _MAX_SHOWN] + "..."
    return text


class _PackError(Exception):
    """A packing failure with its message; wrapped with the argument by
    `_run_packer`."""


# --- Packing with descriptors -------------------------------------------------

# Element types of `["ndarray", type, ...]` arguments, as numpy dtypes.
_ARG_ARRAY_DTYPES = {
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i16": np.dtype(np.int16),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
}

# Integer scalar descriptors and the range of values they hold.
_INT_RANGES = {
    "i8": (-(2**7), 2**7 - 1),
    "i16": (-(2**15), 2**15 - 1),
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
}


def _packer_for(desc) -> _Packer:
    """The packer of a descriptor; ValueError naming an unknown one."""
    if isinstance(desc, list):
        kind = desc[0] if desc else None
        if kind == "ndarray":
            return _ndarray_packer(desc)
        if kind in ("slist", "stuple"):
            return _sequence_packer([_packer_for(d) for d in desc[1:]])
        if kind == "sdict":
            return _dict_packer([(item[0], _packer_for(item[1])) for item in desc[1:]])
        raise ValueError(f"Unrecognized reflection compound type: {kind}")
    if desc in _INT_RANGES:
        return _int_packer(desc, *_INT_RANGES[desc])
    if desc in ("f32", "f64"):
        return _float_packer(desc)
    raise ValueError(f"Unrecognized reflection primitive type: {desc}")


def _int_packer(desc: str, low: int, high: int) -> _Packer:
    def pack(context, arg_list, value):
        # Integers, including bools and numpy integer scalars, but not floats
        # (a fraction would be lost silently).
        if isinstance(value, (float, np.floating)) or not hasattr(value, "__index__"):
            raise _PackError(f"expected an integer for {desc}, got {_shown(value)}")
        v = value.__index__()
        if not low <= v <= high:
            raise _PackError(f"value {v} out of range for {desc}")
        arg_list.push_int(v)

    return pack


def _float_packer(desc: str) -> _Packer:
    def pack(context, arg_list, value):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise _PackError(f"expected a number for {desc}, got {_shown(value)}")
        arg_list.push_float(float(value))

    return pack


def _ndarray_packer(desc) -> _Packer:
    # ["ndarray", element type, rank, dim...]: the dims are not checked here
    # (the program checks its inputs), the element type fixes the host dtype.
    abi_type = desc[1] if len(desc) > 1 else None
    dtype = _ARG_ARRAY_DTYPES.get(abi_type) if isinstance(abi_type, str) else None
    if dtype is None:
        raise ValueError(f"could not map abi type {abi_type!r} to numpy dtype")
    element_type = map_dtype_to_hal_element_type(dtype)

    def pack(context, arg_list, value):
        if isinstance(value, DeviceArray):
            # Already on a device: passed as is, never brought to the host.
            arg_list.push_ref(value._buffer_view)
            return
        if isinstance(value, HalBufferView):
            arg_list.push_ref(value)
            return
        if _is_cuda_tensor(value):
            _pack_cuda_tensor(context, arg_list, value)
            return
        try:
            host = np.asarray(value, dtype, "C")
        except Exception as e:
            raise _PackError(
                f"could not convert value to numpy array: dtype={dtype.type!r}, "
                f"error='{e}', value={_shown(value)}"
            ) from e
        arg_list.push_ref(_copy_to_device(context.device, host, element_type))

    return pack


def _sequence_packer(items: list) -> _Packer:
    def pack(context, arg_list, value):
        try:
            n = len(value)
        except TypeError as e:
            raise _PackError(f"expected a sequence with {len(items)} values. got: {_shown(value)}") from e
        if n != len(items):
            raise _PackError(f"expected a sequence with {len(items)} values. got: {_shown(value)}")
        sub_list = VmVariantList(len(items))
        for i, packer in enumerate(items):
            try:
                item = value[i]
            except Exception as e:
                raise _PackError(f"could not get item {i} from: {_shown(value)}: {e}") from e
            packer(context, sub_list, item)
        arg_list.push_list(sub_list)

    return pack


def _dict_packer(items: list) -> _Packer:
    def pack(context, arg_list, value):
        try:
            n = len(value)
        except TypeError as e:
            raise _PackError(f"expected a dict with {len(items)} values. got: {_shown(value)}") from e
        if n != len(items):
            raise _PackError(f"expected a dict with {len(items)} values. got: {_shown(value)}")
        sub_list = VmVariantList(len(items))
        for key, packer in items:
            try:
                item = value[key]
            except Exception as e:
                raise _PackError(f"could not get item {key!r} from: {_shown(value)}: {e}") from e
            packer(context, sub_list, item)
        arg_list.push_list(sub_list)

    return pack


# --- Packing without descriptors (dynamic mode) -------------------------------


def _generic_packer(value) -> Optional[_Packer]:
    """The packer for a value by its exact type (a bool is not an int here,
    nor a numpy scalar a float: those go through the array protocol), or
    None when it has no VM form."""
    packer = _GENERIC_PACKERS.get(type(value))
    if packer is None and _is_cuda_tensor(value):
        return _pack_cuda_tensor
    if packer is None and hasattr(value, "__array__"):
        return _pack_host_array
    return packer


def _pack_any(context, arg_list, value):
    packer = _generic_packer(value)
    if packer is None:
        raise _PackError(f"could not convert python value to VM: {_shown(value)}")
    packer(context, arg_list, value)


def _pack_int(context, arg_list, value):
    if not -(2**63) <= value < 2**63:
        raise _PackError(f"value {value} out of range for i64")
    arg_list.push_int(value)


def _pack_float(context, arg_list, value):
    arg_list.push_float(value)


def _pack_sequence(context, arg_list, value):
    sub_list = VmVariantList(len(value))
    for item in value:
        _pack_any(context, sub_list, item)
    arg_list.push_list(sub_list)


def _pack_dict(context, arg_list, value):
    # Values in the order of their sorted keys (as a program lowered from a
    # dict of named values expects them).
    keys = sorted(value)
    sub_list = VmVariantList(len(keys))
    for key in keys:
        _pack_any(context, sub_list, value[key])
    arg_list.push_list(sub_list)


def _pack_buffer_view(context, arg_list, value):
    arg_list.push_ref(value)


def _pack_device_array(context, arg_list, value):
    arg_list.push_ref(value._buffer_view)


def _pack_cuda_tensor(context, arg_list, value):
    # CUDA memory (a PyTorch CUDA tensor, ...) is used in place through
    # DLPack; numpy could not read it anyway.
    arg_list.push_ref(context.device.from_dlpack_capsule(value))


def _pack_host_array(context, arg_list, value):
    try:
        host = np.asarray(value, None, "C")
    except Exception as e:
        raise _PackError(f"could not convert value to numpy array: error='{e}', value={_shown(value)}") from e
    element_type = map_dtype_to_hal_element_type(host.dtype)
    if element_type is None:
        raise _PackError(f"could not map dtype {host.dtype!r} to element type: mapping not found")
    arg_list.push_ref(_copy_to_device(context.device, host, element_type))


_GENERIC_PACKERS = {
    int: _pack_int,
    float: _pack_float,
    list: _pack_sequence,
    tuple: _pack_sequence,
    dict: _pack_dict,
    HalBufferView: _pack_buffer_view,
    DeviceArray: _pack_device_array,
}


def _copy_to_device(device, host: np.ndarray, element_type) -> HalBufferView:
    """A buffer view on `device` holding a copy of the C-contiguous `host`."""
    return device.allocator.allocate_buffer_copy(
        memory_type=IMPLICIT_BUFFER_ARG_MEMORY_TYPE,
        allowed_usage=IMPLICIT_BUFFER_ARG_USAGE,
        device=device,
        buffer=host,
        element_type=element_type,
    )
