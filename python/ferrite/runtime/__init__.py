"""Ferrite's runtime API: `import ferrite.runtime as rt` in place of `iree.runtime`."""

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
