"""Argument checks shared by the core functions (they run at trace time, so cost nothing in jit)."""
from typing import Sequence

import jax.numpy as jnp
import numpy as np


def check_array(x, name: str, *, ndim: int | Sequence[int] | None = None, kind: str | None = None):
  """Raises ValueError naming `name` unless `x` is an array of the given rank and dtype kind.

  kind: "float" (floating), "bool" (bool), "int" (integer), "bool_or_int", "number".
  """
  if not hasattr(x, "shape") or not hasattr(x, "dtype"):
    raise ValueError(f"{name}: expected an array, got {type(x).__name__}")
  if ndim is not None:
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if x.ndim not in allowed:
      raise ValueError(f"{name}: expected rank {' or '.join(map(str, allowed))}, "
                       f"got shape {tuple(x.shape)}")
  if kind is not None:
    dt = np.dtype(x.dtype)
    ok = {
        "float": jnp.issubdtype(dt, jnp.floating),
        "bool": dt == np.bool_,
        "int": jnp.issubdtype(dt, jnp.integer),
        "bool_or_int": dt == np.bool_ or jnp.issubdtype(dt, jnp.integer),
        "number": jnp.issubdtype(dt, jnp.number) or dt == np.bool_,
    }[kind]
    if not ok:
      raise ValueError(f"{name}: expected a {kind.replace('_', ' ')} dtype, got {dt}")
  return x


def check_same_shape(a, b, name_a: str, name_b: str):
  if tuple(a.shape) != tuple(b.shape):
    raise ValueError(f"{name_b}: shape {tuple(b.shape)} does not match {name_a} {tuple(a.shape)}")
