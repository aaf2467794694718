"""Overlong reward shaping (DAPO §3.4): soft punishment (Eq. 13) and overlong filtering."""
import numbers

import jax.numpy as jnp

from dapo_jax.core._checks import check_array


def soft_overlong_penalty(lengths, *, max_len: int, cache_len: int, factor: float = 1.0):
  """R_length(L) of Eq. 13, with L counted in tokens.

  0 for L <= max_len − cache_len; ((max_len − cache_len) − L) / cache_len · factor on the ramp;
  −factor for L >= max_len (clamped beyond). cache_len = 0 is a hard cut at max_len.
  """
  check_array(lengths, "lengths", kind="number")
  if not _is_int(max_len) or max_len <= 0:
    raise ValueError(f"max_len: must be a positive int (tokens), got {max_len!r}")
  if not _is_int(cache_len) or cache_len < 0:
    raise ValueError(f"cache_len: must be a non-negative int (tokens), got {cache_len!r}")
  if cache_len > max_len:
    raise ValueError(f"cache_len: {cache_len} exceeds max_len {max_len}")
  if not factor >= 0:
    raise ValueError(f"factor: must be >= 0, got {factor}")
  length = lengths.astype(jnp.float32)
  start = max_len - cache_len
  if cache_len == 0:
    ramp = jnp.zeros_like(length)
  else:
    ramp = (start - length) / cache_len
  penalty = jnp.where(length <= start, 0.0, jnp.where(length < max_len, ramp, -1.0))
  return factor * penalty


def overlong_mask(truncated_B):
  """Loss mask of overlong filtering: 0 for truncated responses, 1 otherwise (float32)."""
  check_array(truncated_B, "truncated_B", kind="bool_or_int")
  return (truncated_B == 0).astype(jnp.float32)


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)
