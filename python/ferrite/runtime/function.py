"""`FunctionInvoker`: calls a VM function with Python values and numpy arrays.

The invoker is native (`ferrite._ferrite.FunctionInvoker`): it checks
arguments against the function's `iree.abi.declaration`, turns numpy arrays,
scalars and nested lists/tuples/dicts into VM values (aligned, C-contiguous
arrays without a copy), calls, and returns buffer views as `DeviceArray`s.
"""

from .._ferrite import FunctionInvoker

__all__ = ["FunctionInvoker"]
