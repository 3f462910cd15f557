"""The native objects, plus the enums upstream's native module defines.

Upstream's enums are plain `enum.Enum` classes whose members combine with
`|` and `&` into ints; they are defined here in Python over the same values.
"""

import enum as _enum

from .. import _ferrite
from .._ferrite import (
    HalAllocator,
    HalBuffer,
    HalBufferView,
    HalCommandBuffer,
    HalDevice,
    HalDeviceLoopBridge,
    HalDriver,
    HalExternalTimepoint,
    HalFence,
    HalModuleDebugSink,
    HalSemaphore,
    MappedMemory,
    PyModuleInterface,
    Tokenizer,
    TokenizerDecodeStream,
    TokenizerEncodeStream,
    VmBuffer,
    VmContext,
    VmFunction,
    VmInstance,
    VmModule,
    VmRef,
    VmVariantList,
    create_hal_module,
    parse_flags,
)
from .._ferrite import (
    FileHandle,
    ParameterIndex,
    ParameterIndexEntry,
    ParameterProvider,
    create_io_parameters_module,
)


class _IntValued(_enum.Enum):
    """An enum whose members print as `Class.NAME` and act as ints in arithmetic."""

    def __repr__(self):
        return f"{type(self).__name__}.{self.name}"

    __str__ = __repr__

    def __int__(self):
        return self.value

    def __index__(self):
        return self.value

    def __or__(self, other):
        return self.value | int(other)

    __ror__ = __or__

    def __and__(self, other):
        return self.value & int(other)

    __rand__ = __and__

    def __hash__(self):
        return hash(self._name_)


class MemoryType(_IntValued):
    NONE = 0
    OPTIMAL = 1
    HOST_VISIBLE = 2
    HOST_COHERENT = 4
    HOST_CACHED = 8
    HOST_LOCAL = 70
    DEVICE_VISIBLE = 16
    DEVICE_LOCAL = 48


class BufferUsage(_IntValued):
    NONE = 0
    TRANSFER_SOURCE = 1
    TRANSFER_TARGET = 2
    TRANSFER = 3
    DISPATCH_INDIRECT_PARAMETERS = 256
    DISPATCH_UNIFORM_READ = 512
    DISPATCH_STORAGE_READ = 1024
    DISPATCH_STORAGE_WRITE = 2048
    DISPATCH_STORAGE = 3072
    DISPATCH_IMAGE_READ = 4096
    DISPATCH_IMAGE_WRITE = 8192
    DISPATCH_IMAGE = 12288
    SHARING_EXPORT = 65536
    SHARING_REPLICATE = 131072
    SHARING_CONCURRENT = 262144
    SHARING_IMMUTABLE = 524288
    MAPPING_SCOPED = 16777216
    MAPPING_PERSISTENT = 33554432
    MAPPING_OPTIONAL = 67108864
    MAPPING_ACCESS_RANDOM = 134217728
    MAPPING_ACCESS_SEQUENTIAL_WRITE = 268435456
    MAPPING = 150994944
    DEFAULT = 3075


class MemoryAccess(_IntValued):
    NONE = 0
    READ = 1
    WRITE = 2
    DISCARD = 4
    DISCARD_WRITE = 6
    ALL = 7


class BufferCompatibility(_IntValued):
    NONE = 0
    ALLOCATABLE = 1
    IMPORTABLE = 2
    EXPORTABLE = 4
    QUEUE_TRANSFER = 1024
    QUEUE_DISPATCH = 2048


class _IntFlagValued(_enum.IntFlag):
    """Flags that print as their integer value, as upstream's do."""

    __repr__ = int.__repr__
    __str__ = int.__repr__


class ExternalTimepointType(_IntFlagValued):
    NONE = 0
    ASYNC_PRIMITIVE = 1
    CUDA_EVENT = 2
    HIP_EVENT = 3


class ExternalTimepointFlags(_IntFlagValued):
    NONE = 0


class SemaphoreCompatibility(_IntFlagValued):
    NONE = 0
    HOST_WAIT = 1
    DEVICE_WAIT = 2
    HOST_SIGNAL = 4
    DEVICE_SIGNAL = 8
    HOST_ONLY = 5
    DEVICE_ONLY = 10
    ALL = 15


class Linkage(_IntValued):
    INTERNAL = 0
    IMPORT = 1
    IMPORT_OPTIONAL = 3
    EXPORT = 2
    EXPORT_OPTIONAL = 4


class HalElementType(_IntValued):
    NONE = 0
    OPAQUE_8 = 8
    OPAQUE_16 = 16
    OPAQUE_32 = 32
    OPAQUE_64 = 64
    BOOL_8 = 318767112
    INT_4 = 268435460
    INT_8 = 268435464
    INT_16 = 268435472
    INT_32 = 268435488
    INT_64 = 268435520
    SINT_4 = 285212676
    SINT_8 = 285212680
    SINT_16 = 285212688
    SINT_32 = 285212704
    SINT_64 = 285212736
    UINT_4 = 301989892
    UINT_8 = 301989896
    UINT_16 = 301989904
    UINT_32 = 301989920
    UINT_64 = 301989952
    FLOAT_16 = 553648144
    FLOAT_32 = 553648160
    FLOAT_64 = 553648192
    BFLOAT_16 = 570425360
    COMPLEX_64 = 587202624
    COMPLEX_128 = 587202688
    FLOAT_8_E4M3_FN = 620757000
    FLOAT_8_E4M3_FNUZ = 654311432
    FLOAT_8_E5M2 = 603979784
    FLOAT_8_E5M2_FNUZ = 637534216
    FLOAT_8_E8M0_FNU = 671088648

    @staticmethod
    def map_to_dtype(element_type):
        from . import dtypes

        return dtypes.element_type_to_dtype(HalElementType(int(element_type)))

    @staticmethod
    def is_byte_aligned(element_type):
        return _ferrite.element_type_is_byte_aligned(int(element_type))

    @staticmethod
    def dense_byte_count(element_type):
        return _ferrite.element_type_dense_byte_count(int(element_type))


class Shape:
    """A list of dimensions, as upstream's native `Shape` holder."""

    __slots__ = ["dims"]

    def __init__(self, indices):
        self.dims = tuple(int(i) for i in indices)

    def __repr__(self):
        return f"Shape({list(self.dims)})"


_driver_cache = {}


def _driver_name(device_uri: str) -> str:
    return device_uri.split("://", 1)[0].split(":", 1)[0]


def create_hal_driver(device_uri: str) -> HalDriver:
    """A new driver for `device_uri` (`local-task`, `local-sync://`)."""
    return HalDriver.create(device_uri)


def get_cached_hal_driver(device_uri: str) -> HalDriver:
    """The process-wide driver for the driver named by `device_uri`."""
    name = _driver_name(device_uri)
    driver = _driver_cache.get(name)
    if driver is None:
        driver = _driver_cache.setdefault(name, create_hal_driver(device_uri))
    return driver


def clear_hal_driver_cache():
    """Forgets cached drivers; the next lookup creates new ones."""
    _driver_cache.clear()


def disable_leak_checker():
    """Upstream turns off its allocation leak checker here. Ferrite frees by
    ownership and has no leak checker, so there is nothing to turn off."""


# Upstream's argument packer is native; ours is Python (`_packing`), built on
# this module, so it is imported on first use rather than here.
_PACKING_NAMES = ("ArgumentPacker", "InvokeContext", "_InvokeStatics", "_invoke_statics")


def __getattr__(name):
    if name in _PACKING_NAMES:
        from . import _packing

        return getattr(_packing, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_PACKING_NAMES))
