"""numpy dtypes of HAL element types (bfloat16 and float8 from ml_dtypes)."""

import dataclasses as _dataclasses

import numpy as np

from ._binding import HalElementType as _E

_NUMPY = {
    _E.BOOL_8: np.bool_,
    _E.INT_8: np.int8,
    _E.SINT_8: np.int8,
    _E.UINT_8: np.uint8,
    _E.INT_16: np.int16,
    _E.SINT_16: np.int16,
    _E.UINT_16: np.uint16,
    _E.INT_32: np.int32,
    _E.SINT_32: np.int32,
    _E.UINT_32: np.uint32,
    _E.INT_64: np.int64,
    _E.SINT_64: np.int64,
    _E.UINT_64: np.uint64,
    _E.FLOAT_16: np.float16,
    _E.FLOAT_32: np.float32,
    _E.FLOAT_64: np.float64,
    _E.COMPLEX_64: np.complex64,
    _E.COMPLEX_128: np.complex128,
}

try:
    import ml_dtypes as _ml

    _NUMPY.update(
        {
            _E.BFLOAT_16: _ml.bfloat16,
            _E.FLOAT_8_E4M3_FN: _ml.float8_e4m3fn,
            _E.FLOAT_8_E4M3_FNUZ: _ml.float8_e4m3fnuz,
            _E.FLOAT_8_E5M2: _ml.float8_e5m2,
            _E.FLOAT_8_E5M2_FNUZ: _ml.float8_e5m2fnuz,
            _E.FLOAT_8_E8M0_FNU: _ml.float8_e8m0fnu,
        }
    )
except ImportError:  # ml_dtypes is optional
    pass

# Preferred element type for each dtype (signedness made explicit, as upstream).
_FROM_NUMPY = {
    np.dtype(np.bool_): _E.BOOL_8,
    np.dtype(np.int8): _E.SINT_8,
    np.dtype(np.uint8): _E.UINT_8,
    np.dtype(np.int16): _E.SINT_16,
    np.dtype(np.uint16): _E.UINT_16,
    np.dtype(np.int32): _E.SINT_32,
    np.dtype(np.uint32): _E.UINT_32,
    np.dtype(np.int64): _E.SINT_64,
    np.dtype(np.uint64): _E.UINT_64,
    np.dtype(np.float16): _E.FLOAT_16,
    np.dtype(np.float32): _E.FLOAT_32,
    np.dtype(np.float64): _E.FLOAT_64,
    np.dtype(np.complex64): _E.COMPLEX_64,
    np.dtype(np.complex128): _E.COMPLEX_128,
}
for _et in (_E.BFLOAT_16, _E.FLOAT_8_E4M3_FN, _E.FLOAT_8_E4M3_FNUZ, _E.FLOAT_8_E5M2, _E.FLOAT_8_E5M2_FNUZ, _E.FLOAT_8_E8M0_FNU):
    if _et in _NUMPY:
        _FROM_NUMPY[np.dtype(_NUMPY[_et])] = _et


def element_type_to_dtype(element_type):
    """The numpy dtype of `element_type`, or None when numpy has none."""
    t = _NUMPY.get(element_type)
    return None if t is None else np.dtype(t)


def dtype_to_element_type(dtype):
    """The HAL element type of a numpy dtype; ValueError when unsupported."""
    try:
        return _FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise ValueError(f"Unsupported numpy dtype {dtype}") from None

@_dataclasses.dataclass(frozen=True)
class DTypeInfo:
    """A numpy dtype with its name, its `--input` spelling and HAL element type."""

    dtype: np.dtype
    name: str
    abi_type: str
    hal_type: _E

    @property
    def is_complex(self) -> bool:
        return np.issubdtype(self.dtype, np.complexfloating)

    @property
    def is_floating_point(self) -> bool:
        return np.issubdtype(self.dtype, np.floating)

    @property
    def is_integer(self) -> bool:
        return np.issubdtype(self.dtype, np.integer)

    @property
    def is_signed(self) -> bool:
        return np.issubdtype(self.dtype, np.signedinteger)


# (numpy type, --input spelling, element type); unsigned integers use the
# signless spelling, so that spelling maps back to the signed type.
_INFO_ROWS = [
    (np.float16, "f16", _E.FLOAT_16),
    (np.float32, "f32", _E.FLOAT_32),
    (np.float64, "f64", _E.FLOAT_64),
    (np.int8, "i8", _E.SINT_8),
    (np.uint8, "i8", _E.UINT_8),
    (np.int16, "i16", _E.SINT_16),
    (np.uint16, "i16", _E.UINT_16),
    (np.int32, "i32", _E.SINT_32),
    (np.uint32, "i32", _E.UINT_32),
    (np.int64, "i64", _E.SINT_64),
    (np.uint64, "i64", _E.UINT_64),
    (np.bool_, "i1", _E.BOOL_8),
    (np.complex64, "complex<f32>", _E.COMPLEX_64),
    (np.complex128, "complex<f64>", _E.COMPLEX_128),
]
_BY_DTYPE = {
    np.dtype(t): DTypeInfo(np.dtype(t), np.dtype(t).name, abi, hal) for t, abi, hal in _INFO_ROWS
}
_BY_NAME = {info.name: info for info in _BY_DTYPE.values()}
_BY_ABI_TYPE = {
    info.abi_type: info for info in _BY_DTYPE.values() if not info.is_integer or info.is_signed
}


def map_dtype_to_dtype_info(dtype) -> DTypeInfo:
    """The `DTypeInfo` of a numpy dtype; KeyError when there is none."""
    dtype = np.dtype(dtype)
    try:
        return _BY_DTYPE[dtype]
    except KeyError:
        raise KeyError(f"Numpy dtype {dtype} not found.") from None


def map_name_to_dtype_info(name: str) -> DTypeInfo:
    """The `DTypeInfo` of a dtype name such as `"float32"`."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise KeyError(f"Numpy dtype name {name!r} not found.") from None


def map_abi_type_to_dtype_info(abi_type: str) -> DTypeInfo:
    """The `DTypeInfo` of an `--input` spelling such as `"i32"` (signed)."""
    try:
        return _BY_ABI_TYPE[abi_type]
    except KeyError:
        raise KeyError(f"ABI type {abi_type!r} not found.") from None


def map_dtype_to_hal_element_type(dtype):
    """The HAL element type of a dtype (ml_dtypes' included), or None."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        return None
    info = _BY_DTYPE.get(dtype)
    if info is not None:
        return info.hal_type
    return _FROM_NUMPY.get(dtype)


# The element-type spelling of each dtype in `--input=SHAPExTYPE=...` flags
# (unsigned integers use the signless spelling, as upstream).
DTYPE_TO_ABI_TYPE = {info.dtype: info.abi_type for info in _BY_DTYPE.values()}
