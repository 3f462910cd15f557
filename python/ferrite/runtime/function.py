"""`FunctionInvoker`: calls a VM function with Python values and numpy arrays.

The invoker is native (`ferrite._ferrite.FunctionInvoker`): it checks
arguments against the function's `iree.abi.declaration`, turns numpy arrays,
scalars and nested lists/tuples/dicts into VM values (aligned, C-contiguous
arrays without a copy), calls, and returns buffer views as `DeviceArray`s.
"""

from .._ferrite import FunctionInvoker
from ._binding import BufferUsage, MemoryType

# Memory type and usage of the device buffers the invoker allocates for host
# arrays it cannot import in place (upstream exposes the same two names).
IMPLICIT_BUFFER_ARG_MEMORY_TYPE = MemoryType.DEVICE_LOCAL
IMPLICIT_BUFFER_ARG_USAGE = BufferUsage.DEFAULT

__all__ = [
    "FunctionInvoker",
    "IMPLICIT_BUFFER_ARG_MEMORY_TYPE",
    "IMPLICIT_BUFFER_ARG_USAGE",
]
