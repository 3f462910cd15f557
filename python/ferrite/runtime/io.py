"""Parameter archives from Python: build indexes from arrays, write `.irpa`
files, and read entries back as numpy arrays (the API of `iree.runtime.io`).

Entries added from numpy carry a small metadata blob,
`TENSORv0:{json}`, naming dtype and shape, so that
`parameter_index_entry_as_numpy_ndarray` can rebuild the array; blobs with
the older `PYTORCH:` prefix are read the same way.
"""

import json
from functools import reduce
from operator import mul
from os import PathLike
from typing import Any, Sequence, Union

import numpy as np

from ._binding import ParameterIndex, ParameterIndexEntry
from .dtypes import map_dtype_to_dtype_info, map_name_to_dtype_info

__all__ = [
    "parameter_index_add_numpy_ndarray",
    "parameter_index_entry_as_numpy_flat_ndarray",
    "parameter_index_entry_as_numpy_ndarray",
    "SplatValue",
    "save_archive_file",
]

_TENSOR_PREFIX = "TENSORv0"
_TURBINE_PREFIX = "PYTORCH"
_SEPARATOR = ":"


class SplatValue:
    """A parameter whose bytes all repeat one element (stored without data).

    `pattern` is a single-element array or numpy scalar; `count` is the
    element count, or a shape whose product is the count.
    """

    def __init__(self, pattern, count: Union[Sequence[int], int]):
        if isinstance(pattern, np.ndarray):
            elements = int(np.prod(pattern.shape)) if pattern.shape else 1
        elif isinstance(pattern, np.generic):
            elements = 1
        else:
            elements = len(pattern)
        if elements != 1:
            raise ValueError("SplatValue requires an array of a single element")
        self.pattern = pattern
        if isinstance(count, int):
            n = count
        else:
            n = reduce(mul, count, 1)
        self.total_length = n * pattern.itemsize

    def __repr__(self):
        return f"SplatValue({self.pattern} of {self.total_length})"


def save_archive_file(entries: "dict[str, Union[Any, SplatValue]]", file_path: PathLike):
    """Writes an IREE parameter archive (`.irpa`) holding `entries`: each
    value is a buffer (bytes, numpy array, ...) or a `SplatValue`."""
    index = ParameterIndex()
    for key, value in entries.items():
        if isinstance(value, SplatValue):
            index.add_splat(key, value.pattern, value.total_length)
        else:
            index.add_buffer(key, value)
    index.create_archive_file(str(file_path))


def _tensor_metadata(array: np.ndarray) -> str:
    dt = array.dtype
    info = map_dtype_to_dtype_info(dt)
    description = {
        "type": "Tensor",
        "dtype": info.name,
        "shape": list(array.shape),
        "dtype_desc": {
            "class_name": type(dt).__name__,
            "is_complex": info.is_complex,
            "is_floating_point": info.is_floating_point,
            "is_signed": info.is_signed,
            "itemsize": dt.itemsize,
        },
    }
    return f"{_TENSOR_PREFIX}{_SEPARATOR}{json.dumps(description)}"


def parameter_index_add_numpy_ndarray(index: ParameterIndex, name: str, array: np.ndarray):
    """Adds `array`'s bytes (not copied, unless 0-d) to `index` as `name`,
    with metadata describing its dtype and shape."""
    metadata = _tensor_metadata(array)
    if array.ndim == 0:
        # A 0-d array does not reliably expose a byte view; it is tiny, so copy.
        flat = array.reshape(1).copy().view(np.uint8)
    else:
        flat = np.ascontiguousarray(array).view(np.uint8)
    index.add_buffer(name, flat, metadata=metadata)


def parameter_index_entry_as_numpy_flat_ndarray(index_entry: ParameterIndexEntry) -> np.ndarray:
    """The entry's bytes as a flat uint8 array: a view of the file for file
    entries, a copy of the pattern for splats."""
    if index_entry.is_file:
        return np.asarray(index_entry.file_view)
    if index_entry.is_splat:
        return np.frombuffer(index_entry.splat_pattern, dtype=np.uint8).copy()
    raise ValueError(f"Unsupported ParameterIndexEntry: {index_entry}")


def parameter_index_entry_as_numpy_ndarray(index_entry: ParameterIndexEntry) -> np.ndarray:
    """The entry viewed with the dtype and shape its metadata records;
    ValueError when the metadata is missing or not a tensor description."""
    text = index_entry.metadata.decode()
    prefix, sep, body = text.partition(_SEPARATOR)
    if not sep:
        raise ValueError(
            f'Invalid metadata for parameter index entry "{index_entry.key}". '
            f'Expected format version prefix not found in "{prefix[:100]}".'
        )
    if prefix not in (_TENSOR_PREFIX, _TURBINE_PREFIX):
        raise ValueError(
            f'Unsupported metadata format version "{prefix}" for parameter index entry '
            f'"{index_entry.key}": Cannot convert to tensor'
        )
    desc = json.loads(body)
    try:
        kind = desc["type"]
        dtype_name = desc["dtype"]
        shape = desc["shape"]
    except KeyError as e:
        raise ValueError(f"Bad metadata for parameter entry {index_entry.key}") from e
    if kind != "Tensor":
        raise ValueError(f"Metadata for parameter entry {index_entry.key} is not a Tensor ('{kind}')")
    try:
        dtype = map_name_to_dtype_info(dtype_name).dtype
    except KeyError as e:
        raise ValueError(f"Unsupported dtype for parameter entry {index_entry.key}") from e
    try:
        shape = [int(d) for d in shape]
    except ValueError as e:
        raise ValueError(f"Illegal shape for parameter entry {index_entry.key}") from e
    return parameter_index_entry_as_numpy_flat_ndarray(index_entry).view(dtype=dtype).reshape(shape)
