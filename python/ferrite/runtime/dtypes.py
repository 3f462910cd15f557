"""numpy dtypes of HAL element types (bfloat16 and float8 from ml_dtypes)."""

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

# The element-type spelling of each dtype in `--input=SHAPExTYPE=...` flags
# (unsigned integers use the signless spelling, as upstream).
DTYPE_TO_ABI_TYPE = {
    np.dtype(np.float16): "f16",
    np.dtype(np.float32): "f32",
    np.dtype(np.float64): "f64",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint8): "i8",
    np.dtype(np.int16): "i16",
    np.dtype(np.uint16): "i16",
    np.dtype(np.int32): "i32",
    np.dtype(np.uint32): "i32",
    np.dtype(np.int64): "i64",
    np.dtype(np.uint64): "i64",
    np.dtype(np.bool_): "i1",
    np.dtype(np.complex64): "complex<f32>",
    np.dtype(np.complex128): "complex<f64>",
}
