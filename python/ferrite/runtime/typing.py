"""Type aliases of the runtime API."""

from typing import TYPE_CHECKING, Callable, List

if TYPE_CHECKING:
    from . import HalBufferView

# The key a program gives a traced set of tensors (`flow.tensor.trace "key"`).
TraceKey = str

# Called with the trace key and the traced buffer views of each trace op.
HalModuleBufferViewTraceCallback = Callable[[TraceKey, List["HalBufferView"]], None]
