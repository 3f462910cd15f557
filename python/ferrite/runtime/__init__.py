"""Ferrite's runtime API: `import ferrite.runtime as rt` in place of `iree.runtime`.

Where Ferrite deliberately differs from upstream `iree.runtime` 3.13 (every
other mistake raises upstream's exception class; see
`tests/python/test_upstream_parity.py` and `test_api_strictness.py`):

Stricter:
* A `VmBuffer` exported through the buffer protocol (a live `memoryview` or
  numpy array over it) is locked for the export's life: a VM operation on the
  buffer meanwhile fails (`RuntimeError`, FAILED_PRECONDITION, naming the
  export) instead of racing Python's writes as upstream's does. Write inputs
  or read results, then release the export (`with memoryview(buf) as m:`,
  `del arr`) before invoking a function that uses the buffer.
* Arguments are checked against the function's `iree.abi.declaration` before
  the call: a wrong kind, rank or dimension is a `ValueError` naming the
  argument (upstream fails inside the program, or not at all).

More lenient, on purpose:
* `HalFence.join([])` is an empty fence, already reached (upstream returns a
  null object that raises on first use): the join of no fences is defined.
* numpy scalars (`np.int32(2)`) pass for scalar arguments of their kind
  (upstream refuses `np.int32` with a RuntimeError from inside the call);
  `bool` and `np.bool_` are refused, as upstream refuses `bool`.
* `HalBuffer.create_view` also takes a sequence of ints for the shape and a
  `HalElementType` for the element (upstream: a `Shape` and a size in bytes,
  which ours takes too); `HalBufferView(buffer, shape, ...)` also takes a
  `Shape`.
* Memory-type and usage bits that name no flag pass through to the buffer,
  as upstream's do (the enums themselves refuse unknown values, as upstream's).
"""

from . import _binding

from ._binding import (
    BufferCompatibility,
    BufferUsage,
    ExternalTimepointFlags,
    ExternalTimepointType,
    HalAllocator,
    HalBuffer,
    HalBufferView,
    HalCommandBuffer,
    HalDevice,
    HalDeviceLoopBridge,
    HalDriver,
    HalElementType,
    HalExternalTimepoint,
    HalFence,
    HalModuleDebugSink,
    HalSemaphore,
    MappedMemory,
    MemoryAccess,
    MemoryType,
    SemaphoreCompatibility,
    create_hal_module,
)

from ._binding import (
    Linkage,
    VmBuffer,
    VmVariantList,
    VmFunction,
    VmInstance,
    VmContext,
    VmModule,
    VmRef,
)

# Python-defined modules
from ._binding import PyModuleInterface, Shape

# Tokenizer imports
from ._binding import (
    Tokenizer,
    TokenizerEncodeStream,
    TokenizerDecodeStream,
)

# Parameter I/O
from ._binding import (
    FileHandle,
    ParameterIndex,
    ParameterIndexEntry,
    ParameterProvider,
    create_io_parameters_module,
)
from .io import *
from . import io

from .typing import HalModuleBufferViewTraceCallback

from .array_interop import *
from .benchmark import *
from .system_api import *
from .system_setup import (
    get_device,
    get_first_device,
    get_driver,
    query_available_drivers,
)
from .function import *
from . import dtypes
from . import flags
from .trace import start_trace, stop_trace, is_tracing, tracing
