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
  types alone; see `_packing.ArgumentPacker`) and unpacks the result list
  the same way, as upstream's invoker does.
"""

import abc
import json
import logging

from .. import _ferrite
from ._binding import HalBufferView, VmContext, VmFunction, VmRef, VmVariantList
from ._packing import (
    IMPLICIT_BUFFER_ARG_MEMORY_TYPE,
    IMPLICIT_BUFFER_ARG_USAGE,
    ArgumentError,
    ArgumentPacker,
    InvokeContext,
    _invoke_statics,
)
from .array_interop import DeviceArray
from .dtypes import map_abi_type_to_dtype_info

__all__ = [
    "ArgumentError",
    "FunctionInvoker",
    "IMPLICIT_BUFFER_ARG_MEMORY_TYPE",
    "IMPLICIT_BUFFER_ARG_USAGE",
    "ReflectionInvoker",
    "ReturnError",
]

_NativeInvoker = _ferrite.FunctionInvoker


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


class ReflectionInvoker(FunctionInvoker):
    """The Python invoker: duck-typed contexts and functions, `iree.abi`
    reflection, or no reflection at all (dynamic mode)."""

    __slots__ = ["_vm_context", "_device", "_vm_function", "_packer", "_ret_descs", "_inlined_results"]

    def __init__(self, vm_context, device, vm_function, tracer=None):
        del tracer  # accepted for the native invoker's signature; unused here
        self._vm_context = vm_context
        self._device = device
        self._vm_function = vm_function
        arg_descs, self._ret_descs = _parse_reflection(vm_function)
        self._packer = ArgumentPacker(_invoke_statics, arg_descs)
        # A lone slist/stuple/sdict result describes the function's results
        # themselves (they are returned flat, not as one list).
        self._inlined_results = (
            self._ret_descs is not None
            and len(self._ret_descs) == 1
            and isinstance(self._ret_descs[0], list)
            and bool(self._ret_descs[0])
            and self._ret_descs[0][0] in ("slist", "stuple", "sdict")
        )

    def __call__(self, *args, **kwargs):
        arg_list = self._packer.pack(InvokeContext(self._device), args, kwargs)
        ret_list = VmVariantList(len(self._ret_descs) if self._ret_descs is not None else 1)
        self._vm_context.invoke(self._vm_function, arg_list, ret_list)
        if self._inlined_results:
            wrapped = VmVariantList(1)
            wrapped.push_list(ret_list)
            ret_list = wrapped
        results = _unpack_sequence(_Decoding(self._device), ret_list, self._ret_descs)
        if not results:
            return None
        if len(results) == 1:
            return results[0]
        return tuple(results)

    def __repr__(self):
        return repr(self._vm_function)


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


# --- Unpacking results --------------------------------------------------------


class _Decoding:
    """One call's device and the result being converted (for error messages)."""

    __slots__ = ["device", "desc", "ret_list", "ret_index"]

    def __init__(self, device):
        self.device = device
        self.desc = None
        self.ret_list = None
        self.ret_index = 0

    def at(self, ret_list, index, desc):
        self.ret_list, self.ret_index, self.desc = ret_list, index, desc

    def return_error(self, summary: str) -> "ReturnError":
        where = ""
        if self.ret_list is not None:
            try:
                where = f"{self.ret_index}@{self.ret_list} with description {self.desc}"
            except Exception:  # a list that cannot print must not hide the error
                where = f"<error printing list item> with description {self.desc}"
        return ReturnError(f"Error processing function return: {summary} (while decoding return {where})")


def _unpack_sequence(call: _Decoding, vm_list, descs) -> list:
    """The Python values of `vm_list`'s items, one descriptor each (None:
    dynamic mode)."""
    n = len(vm_list)
    if descs is None:
        descs = [None] * n
    elif n != len(descs):
        raise call.return_error(f"mismatched return arity: {n} vs {len(descs)}")
    results = []
    for index, desc in enumerate(descs):
        call.at(vm_list, index, desc)
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


def _dynamic_result(call: _Decoding, value):
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
