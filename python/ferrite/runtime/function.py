"""`FunctionInvoker`: calls a VM function with Python values and numpy arrays.

Two invokers stand behind the one name, chosen when the invoker is made:

* The native one (`ferrite._ferrite.FunctionInvoker`), for our own
  `VmContext` and `VmFunction` when the function carries no legacy `iree.abi`
  reflection. It checks arguments against the function's
  `iree.abi.declaration`, turns numpy arrays, scalars and nested
  lists/tuples/dicts into VM values (aligned, C-contiguous arrays without a
  copy), calls, and returns buffer views as `DeviceArray`s. Calls through it
  make one trip through Python, so it is the path every compiled module takes.
* `ReflectionInvoker`, in Python, for everything else: any context object
  with `invoke(vm_function, arg_list, ret_list)`, any function object with a
  `reflection` dict, and functions described by the legacy `iree.abi` JSON
  (`{"a": [...], "r": [...]}`). It packs arguments into a `VmVariantList`
  following the descriptors (or, with no reflection, following the Python
  types alone) and unpacks the result list the same way, as upstream's
  invoker does.
"""

import abc
import json
import logging
from typing import Any, Callable, Optional

import numpy as np

from .. import _ferrite
from ._binding import BufferUsage, HalBufferView, MemoryType, VmContext, VmFunction, VmRef, VmVariantList
from .array_interop import DeviceArray
from .dtypes import map_abi_type_to_dtype_info, map_dtype_to_hal_element_type

__all__ = [
    "ArgumentError",
    "FunctionInvoker",
    "IMPLICIT_BUFFER_ARG_MEMORY_TYPE",
    "IMPLICIT_BUFFER_ARG_USAGE",
    "ReflectionInvoker",
    "ReturnError",
]

# Memory type and usage of the device buffers an invoker allocates for host
# arrays it does not import in place (upstream exposes the same two names).
IMPLICIT_BUFFER_ARG_MEMORY_TYPE = MemoryType.DEVICE_LOCAL
IMPLICIT_BUFFER_ARG_USAGE = BufferUsage.DEFAULT

_NativeInvoker = _ferrite.FunctionInvoker


class ArgumentError(ValueError):
    """A Python value could not be passed as a function argument."""


class ReturnError(ValueError):
    """A function result could not be turned into a Python value."""


class FunctionInvoker(metaclass=abc.ABCMeta):
    """Wraps a VM function so that calling it runs the function in a context.

    `FunctionInvoker(vm_context, device, vm_function)` is the native invoker
    when both are Ferrite's own objects and the function has no legacy
    `iree.abi` reflection, else a `ReflectionInvoker`; both are instances of
    this class. Host arrays passed as arguments are placed on `device`.
    """

    def __new__(cls, vm_context, device, vm_function, tracer=None):
        if cls is FunctionInvoker:
            if _takes_native_path(vm_context, vm_function):
                return _NativeInvoker(vm_context, device, vm_function, tracer)
            cls = ReflectionInvoker
        # Python then runs the `__init__` of the instance's own class.
        return object.__new__(cls)

    @property
    def vm_function(self):
        """The function this invoker calls."""
        return self._vm_function


FunctionInvoker.register(_NativeInvoker)


def _takes_native_path(vm_context, vm_function) -> bool:
    # Exact types: a subclass may override `invoke` or `reflection`, which the
    # native invoker would bypass.
    return (
        type(vm_context) is VmContext
        and type(vm_function) is VmFunction
        and "iree.abi" not in vm_function.reflection
    )


# A packer appends the VM value of one Python value to a VmVariantList.
_Packer = Callable[["_Call", VmVariantList, Any], None]


class ReflectionInvoker(FunctionInvoker):
    """The Python invoker: duck-typed contexts and functions, `iree.abi`
    reflection, or no reflection at all (dynamic mode)."""

    __slots__ = [
        "_vm_context",
        "_device",
        "_vm_function",
        "_arg_descs",
        "_ret_descs",
        "_inlined_results",
        "_packers",
        "_positional_count",
        "_kwarg_index",
    ]

    def __init__(self, vm_context, device, vm_function, tracer=None):
        del tracer  # accepted for the native invoker's signature; unused here
        self._vm_context = vm_context
        self._device = device
        self._vm_function = vm_function
        self._arg_descs, self._ret_descs = _parse_reflection(vm_function)
        # A lone slist/stuple/sdict result describes the function's results
        # themselves (they are returned flat, not as one list).
        self._inlined_results = (
            self._ret_descs is not None
            and len(self._ret_descs) == 1
            and isinstance(self._ret_descs[0], list)
            and bool(self._ret_descs[0])
            and self._ret_descs[0][0] in ("slist", "stuple", "sdict")
        )
        self._packers: Optional[list] = None
        self._positional_count = 0
        self._kwarg_index: dict = {}
        if self._arg_descs is not None:
            self._packers = []
            for desc in self._arg_descs:
                if isinstance(desc, list) and desc and desc[0] == "named":
                    self._kwarg_index[desc[1]] = len(self._packers)
                    desc = desc[2]
                else:
                    self._positional_count += 1
                self._packers.append((_packer_for(desc), desc))

    def __call__(self, *args, **kwargs):
        call = _Call(self._device)
        arg_list = self._pack(call, args, kwargs)
        ret_list = VmVariantList(len(self._ret_descs) if self._ret_descs is not None else 1)
        self._vm_context.invoke(self._vm_function, arg_list, ret_list)
        if self._inlined_results:
            wrapped = VmVariantList(1)
            wrapped.push_list(ret_list)
            ret_list = wrapped
        results = _unpack_sequence(call, ret_list, self._ret_descs)
        if not results:
            return None
        if len(results) == 1:
            return results[0]
        return tuple(results)

    def __repr__(self):
        return repr(self._vm_function)

    def _pack(self, call: "_Call", args, kwargs) -> VmVariantList:
        if self._packers is None:
            if kwargs:
                raise ArgumentError("kwargs not supported for dynamic dispatch functions")
            arg_list = VmVariantList(len(args))
            for arg in args:
                call.encoding(arg, None)
                packer = _generic_packer(arg)
                if packer is None:
                    raise call.argument_error(f"could not convert python value to VM: {arg!r}")
                _run_packer(call, packer, arg_list, arg)
            return arg_list

        if len(args) > self._positional_count:
            raise ArgumentError(
                f"mismatched call arity: expected {self._positional_count} got {len(args)}"
            )
        values = list(args) + [_MISSING] * (len(self._packers) - len(args))
        for name, value in kwargs.items():
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
            call.encoding(value, desc)
            _run_packer(call, packer, arg_list, value)
        return arg_list


_MISSING = object()


def _parse_reflection(vm_function):
    """(argument descriptors, result descriptors) of the `iree.abi` JSON, or
    (None, None) when the function has none (dynamic mode)."""
    reflection = vm_function.reflection
    abi_json = reflection.get("iree.abi")
    if abi_json is None:
        logging.debug("Function lacks reflection data. Interop will be limited: %r", vm_function)
        return None, None
    try:
        abi = json.loads(abi_json)
    except json.JSONDecodeError as e:
        raise RuntimeError(f"Reflection metadata is not valid JSON: {abi_json}") from e
    try:
        arg_descs, ret_descs = abi["a"], abi["r"]
    except (KeyError, TypeError) as e:
        raise RuntimeError(f"Malformed function reflection metadata: {reflection}") from e
    if not isinstance(arg_descs, list) or not isinstance(ret_descs, list):
        raise RuntimeError(f"Malformed function reflection metadata structure: {reflection}")
    return arg_descs, ret_descs


class _Call:
    """One call's device and the value being converted (for error messages)."""

    __slots__ = ["device", "arg", "desc", "ret_list", "ret_index"]

    def __init__(self, device):
        self.device = device
        self.arg = None
        self.desc = None
        self.ret_list = None
        self.ret_index = 0

    def encoding(self, arg, desc):
        self.arg, self.desc = arg, desc

    def decoding(self, ret_list, index, desc):
        self.ret_list, self.ret_index, self.desc = ret_list, index, desc

    def argument_error(self, summary: str) -> ArgumentError:
        if isinstance(self.arg, np.ndarray):
            shown = f"ndarray({self.arg.shape}, {self.arg.dtype})"
        else:
            shown = repr(self.arg)
        return ArgumentError(
            f"Error passing argument: {summary} "
            f"(while encoding argument {shown!r} with description {self.desc})"
        )

    def return_error(self, summary: str) -> ReturnError:
        where = ""
        if self.ret_list is not None:
            try:
                where = f"{self.ret_index}@{self.ret_list} with description {self.desc}"
            except Exception:  # a list that cannot print must not hide the error
                where = f"<error printing list item> with description {self.desc}"
        return ReturnError(f"Error processing function return: {summary} (while decoding return {where})")


def _run_packer(call: _Call, packer: _Packer, arg_list: VmVariantList, value) -> None:
    """Runs a top-level packer; a failure names the argument it was packing."""
    try:
        packer(call, arg_list, value)
    except ArgumentError:
        raise
    except _PackError as e:
        raise call.argument_error(str(e)) from e.__cause__
    except Exception as e:
        raise call.argument_error(f"{type(e).__name__}: {e}") from e


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
    def pack(call, arg_list, value):
        # Integers, including bools and numpy integer scalars, but not floats
        # (a fraction would be lost silently).
        if isinstance(value, (float, np.floating)) or not hasattr(value, "__index__"):
            raise _PackError(f"expected an integer for {desc}, got {value!r}")
        v = value.__index__()
        if not low <= v <= high:
            raise _PackError(f"value {v} out of range for {desc}")
        arg_list.push_int(v)

    return pack


def _float_packer(desc: str) -> _Packer:
    def pack(call, arg_list, value):
        if isinstance(value, (str, bytes)) or not hasattr(value, "__float__"):
            raise _PackError(f"expected a number for {desc}, got {value!r}")
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

    def pack(call, arg_list, value):
        if isinstance(value, DeviceArray):
            # Already on a device: passed as is, never brought to the host.
            arg_list.push_ref(value._buffer_view)
            return
        if isinstance(value, HalBufferView):
            arg_list.push_ref(value)
            return
        try:
            host = np.asarray(value, dtype, "C")
        except Exception as e:
            raise _PackError(
                f"could not convert value to numpy array: dtype={dtype.type!r}, "
                f"error='{e}', value={value!r}"
            ) from e
        arg_list.push_ref(_copy_to_device(call.device, host, element_type))

    return pack


def _sequence_packer(items: list) -> _Packer:
    def pack(call, arg_list, value):
        try:
            n = len(value)
        except TypeError as e:
            raise _PackError(f"expected a sequence with {len(items)} values. got: {value!r}") from e
        if n != len(items):
            raise _PackError(f"expected a sequence with {len(items)} values. got: {value!r}")
        sub_list = VmVariantList(len(items))
        for i, packer in enumerate(items):
            try:
                item = value[i]
            except Exception as e:
                raise _PackError(f"could not get item {i} from: {value!r}: {e}") from e
            packer(call, sub_list, item)
        arg_list.push_list(sub_list)

    return pack


def _dict_packer(items: list) -> _Packer:
    def pack(call, arg_list, value):
        try:
            n = len(value)
        except TypeError as e:
            raise _PackError(f"expected a dict with {len(items)} values. got: {value!r}") from e
        if n != len(items):
            raise _PackError(f"expected a dict with {len(items)} values. got: {value!r}")
        sub_list = VmVariantList(len(items))
        for key, packer in items:
            try:
                item = value[key]
            except Exception as e:
                raise _PackError(f"could not get item {key!r} from: {value!r}: {e}") from e
            packer(call, sub_list, item)
        arg_list.push_list(sub_list)

    return pack


# --- Packing without descriptors (dynamic mode) -------------------------------


def _generic_packer(value) -> Optional[_Packer]:
    """The packer for a value by its exact type (a bool is not an int here,
    nor a numpy scalar a float: those go through the array protocol), or
    None when it has no VM form."""
    packer = _GENERIC_PACKERS.get(type(value))
    if packer is None and hasattr(value, "__array__"):
        return _pack_host_array
    return packer


def _pack_any(call, arg_list, value):
    packer = _generic_packer(value)
    if packer is None:
        raise _PackError(f"could not convert python value to VM: {value!r}")
    packer(call, arg_list, value)


def _pack_int(call, arg_list, value):
    if not -(2**63) <= value < 2**63:
        raise _PackError(f"value {value} out of range for i64")
    arg_list.push_int(value)


def _pack_float(call, arg_list, value):
    arg_list.push_float(value)


def _pack_sequence(call, arg_list, value):
    sub_list = VmVariantList(len(value))
    for item in value:
        _pack_any(call, sub_list, item)
    arg_list.push_list(sub_list)


def _pack_dict(call, arg_list, value):
    # Values in the order of their sorted keys (as a program lowered from a
    # dict of named values expects them).
    keys = sorted(value)
    sub_list = VmVariantList(len(keys))
    for key in keys:
        _pack_any(call, sub_list, value[key])
    arg_list.push_list(sub_list)


def _pack_buffer_view(call, arg_list, value):
    arg_list.push_ref(value)


def _pack_device_array(call, arg_list, value):
    arg_list.push_ref(value._buffer_view)


def _pack_host_array(call, arg_list, value):
    try:
        host = np.asarray(value, None, "C")
    except Exception as e:
        raise _PackError(f"could not convert value to numpy array: error='{e}', value={value!r}") from e
    element_type = map_dtype_to_hal_element_type(host.dtype)
    if element_type is None:
        raise _PackError(f"could not map dtype {host.dtype!r} to element type: mapping not found")
    arg_list.push_ref(_copy_to_device(call.device, host, element_type))


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
    if host.dtype.isbuiltin != 1:
        # ml_dtypes' types (bfloat16, float8) have no buffer-protocol format:
        # copy their bytes as unsigned integers of the same width.
        host = host.view(np.dtype(f"u{host.dtype.itemsize}"))
    return device.allocator.allocate_buffer_copy(
        memory_type=IMPLICIT_BUFFER_ARG_MEMORY_TYPE,
        allowed_usage=IMPLICIT_BUFFER_ARG_USAGE,
        device=device,
        buffer=host,
        element_type=element_type,
    )


# --- Unpacking results --------------------------------------------------------


def _unpack_sequence(call: _Call, vm_list, descs) -> list:
    """The Python values of `vm_list`'s items, one descriptor each (None:
    dynamic mode)."""
    n = len(vm_list)
    if descs is None:
        descs = [None] * n
    elif n != len(descs):
        raise call.return_error(f"mismatched return arity: {n} vs {len(descs)}")
    results = []
    for index, desc in enumerate(descs):
        call.decoding(vm_list, index, desc)
        if desc is None:
            results.append(_dynamic_result(call, vm_list.get_variant(index)))
            continue
        kind = desc if isinstance(desc, str) else desc[0]
        unpacker = _UNPACKERS.get(kind)
        if unpacker is None:
            raise call.return_error(f"cannot map VM type to Python: {kind}")
        try:
            results.append(unpacker(call, vm_list, index, desc))
        except ReturnError:
            raise
        except Exception as e:
            raise call.return_error("exception converting from VM type to Python") from e
    return results


def _dynamic_result(call: _Call, value):
    # Buffer views become DeviceArrays; other values stay as the list gives them.
    view = value if isinstance(value, HalBufferView) else None
    if view is None and isinstance(value, VmRef):
        view = value.deref(HalBufferView, True)
    if view is not None:
        return DeviceArray(call.device, view, implicit_host_transfer=True)
    return value


def _unpack_ndarray(call, vm_list, index, desc):
    view = vm_list.get_as_object(index, HalBufferView)
    abi_type = desc[1]
    try:
        dtype = map_abi_type_to_dtype_info(abi_type).dtype
    except (KeyError, TypeError):
        raise call.return_error(f"unrecognized dtype '{abi_type}'") from None
    return DeviceArray(call.device, view, implicit_host_transfer=True, override_dtype=dtype)


def _unpack_slist(call, vm_list, index, desc):
    return _unpack_sequence(call, vm_list.get_as_list(index), desc[1:])


def _unpack_stuple(call, vm_list, index, desc):
    return tuple(_unpack_slist(call, vm_list, index, desc))


def _unpack_sdict(call, vm_list, index, desc):
    keys = [item[0] for item in desc[1:]]
    values = _unpack_sequence(call, vm_list.get_as_list(index), [item[1] for item in desc[1:]])
    return dict(zip(keys, values))


def _unpack_homogeneous_list(call, vm_list, index, desc):
    # ["py_homogeneous_list", element]: any number of items of one type.
    sub_list = vm_list.get_as_list(index)
    return _unpack_sequence(call, sub_list, list(desc[1:]) * len(sub_list))


def _scalar_unpacker(expected: type):
    def unpack(call, vm_list, index, desc):
        value = vm_list.get_variant(index)
        if not isinstance(value, expected):
            raise ReturnError(f"expected an {expected} value but got {value.__class__}")
        return value

    return unpack


_UNPACKERS = {
    "ndarray": _unpack_ndarray,
    "slist": _unpack_slist,
    "stuple": _unpack_stuple,
    "sdict": _unpack_sdict,
    "py_homogeneous_list": _unpack_homogeneous_list,
    "i8": _scalar_unpacker(int),
    "i16": _scalar_unpacker(int),
    "i32": _scalar_unpacker(int),
    "i64": _scalar_unpacker(int),
    "f16": _scalar_unpacker(float),
    "f32": _scalar_unpacker(float),
    "bf16": _scalar_unpacker(float),
    "f64": _scalar_unpacker(float),
}
