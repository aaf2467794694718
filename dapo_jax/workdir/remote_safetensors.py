"""Safetensors files behind a URL (gs://...), read through dapo_jax.workdir.paths without a local copy.

safetensors' own reader maps a local file into memory; a bucket has no such file. `open_file`
reads a file's header (8 bytes of length, then JSON: each tensor's dtype, shape and byte range)
and gives the same three calls hf_io uses of `safe_open`: keys, get_slice(name).get_shape() and
get_tensor(name). get_tensor returns a LazyTensor, which reads nothing yet: hf_io's astype / .T /
reshape only record the conversion, and `place(sharding)` reads the tensor as a global array
split by rows (its first dimension, contiguous bytes) over every device of the mesh: each device
is filled by reading its own block of rows, so each host reads only the rows of the devices it
holds, a 1/hosts share of the tensor, with one ranged read per device. One jitted transpose /
reshape then moves the blocks into the parameter's own sharding over the chips' interconnect.
A tensor whose rows do not split evenly over the mesh (or placed without one) is read whole.
"""
import dataclasses
import functools
import json
import math
import struct

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax.workdir import paths

DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16,
          "BF16": ml_dtypes.bfloat16, "I64": np.int64, "I32": np.int32, "I16": np.int16,
          "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


@dataclasses.dataclass(frozen=True)
class LazyTensor:
  """A tensor of a safetensors file, as HF stores it ([rows, ...] row-major), with the dtype,
  transpose and shape it is to be placed in."""
  file: str
  start: int                 # byte offset of its data in the file
  hf_shape: tuple
  stored: np.dtype
  dtype: np.dtype
  transpose: bool = False
  shape: tuple = ()

  def astype(self, dtype, copy: bool = False):
    del copy
    return dataclasses.replace(self, dtype=np.dtype(dtype))

  @property
  def T(self):  # noqa: N802  (numpy's name: hf_names.TensorSpec.to_ours calls it)
    if len(self.hf_shape) != 2 or self.transpose:
      raise ValueError(f"{self.file}: only a stored 2-D tensor can be transposed lazily")
    return dataclasses.replace(self, transpose=True, shape=self.hf_shape[::-1])

  def reshape(self, shape):
    shape = tuple(shape)
    if math.prod(shape) != math.prod(self.hf_shape):
      raise ValueError(f"{self.file}: cannot reshape {self.hf_shape} to {shape}")
    return dataclasses.replace(self, shape=shape)

  def read_rows(self, lo: int, hi: int) -> np.ndarray:
    """Rows [lo, hi) of the stored tensor, in `dtype`: one ranged read."""
    row = math.prod(self.hf_shape[1:]) * self.stored.itemsize
    with paths.resolve(self.file).open("rb") as f:
      f.seek(self.start + lo * row)
      data = f.read((hi - lo) * row)
    if len(data) != (hi - lo) * row:
      raise ValueError(f"{self.file}: truncated: {len(data)} of {(hi - lo) * row} bytes")
    rows = np.frombuffer(data, self.stored).reshape((hi - lo, *self.hf_shape[1:]))
    return rows.astype(self.dtype, copy=False)

  def numpy(self) -> np.ndarray:
    """The whole tensor, converted (for small tensors and a placement without a mesh)."""
    x = self.read_rows(0, self.hf_shape[0] if self.hf_shape else 1).reshape(self.hf_shape)
    return (x.T if self.transpose else x).reshape(self.shape)

  def place(self, sharding) -> jax.Array:
    """A device array with `sharding`; each device's rows read by its own host (module doc)."""
    mesh = getattr(sharding, "mesh", None)
    rows = self.hf_shape[0] if self.hf_shape else 0
    if mesh is None or not rows or rows % mesh.size:
      x = self.numpy()
      return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
    load = NamedSharding(mesh, PartitionSpec(tuple(mesh.axis_names),
                                             *[None] * (len(self.hf_shape) - 1)))
    raw = jax.make_array_from_callback(
        self.hf_shape, load, lambda index: self.read_rows(*index[0].indices(rows)[:2]))
    return _to_ours(self.transpose, self.shape, sharding)(raw)


@functools.lru_cache(maxsize=None)
def _to_ours(transpose: bool, shape: tuple, sharding):
  return jax.jit(lambda x: (x.T if transpose else x).reshape(shape), out_shardings=sharding)


class _Slice:
  def __init__(self, shape):
    self._shape = shape

  def get_shape(self):
    return list(self._shape)


class RemoteFile:
  """The calls of a `safe_open` handle that hf_io makes, on a file behind a URL."""

  def __init__(self, file):
    self.file = str(file)
    with paths.resolve(file).open("rb") as f:
      head = f.read(8)
      if len(head) != 8:
        raise ValueError(f"{self.file}: not a safetensors file (shorter than its header)")
      (n,) = struct.unpack("<Q", head)
      try:
        header = json.loads(f.read(n))
      except ValueError as e:
        raise ValueError(f"{self.file}: unreadable safetensors header ({e})") from e
    header.pop("__metadata__", None)
    self._data_start, self._header = 8 + n, header

  def keys(self):
    return list(self._header)

  def get_slice(self, name):
    return _Slice(tuple(self._header[name]["shape"]))

  def get_tensor(self, name) -> LazyTensor:
    entry = self._header[name]
    if entry["dtype"] not in DTYPES:
      raise ValueError(f"{self.file}: tensor {name!r} has dtype {entry['dtype']}, not one of "
                       f"{sorted(DTYPES)}")
    stored = np.dtype(DTYPES[entry["dtype"]])
    shape = tuple(entry["shape"])
    begin, end = entry["data_offsets"]
    if end - begin != math.prod(shape) * stored.itemsize:
      raise ValueError(f"{self.file}: tensor {name!r}: {end - begin} bytes for shape {shape}")
    return LazyTensor(self.file, self._data_start + begin, shape, stored, stored, shape=shape)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    return False


def save_file(tensors: dict, file, metadata: dict) -> None:
  """safetensors' save_file, also to a URL (the file's bytes in one upload)."""
  from safetensors import numpy as st_numpy  # pylint: disable=import-outside-toplevel
  if paths.is_url(file):
    paths.resolve(file).write_bytes(st_numpy.save(tensors, metadata=metadata))
  else:
    st_numpy.save_file(tensors, str(file), metadata=metadata)
