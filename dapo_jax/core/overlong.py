"""Overlong reward shaping (DAPO §3.4): soft punishment (Eq. 13) and overlong filtering.

Adaptive ramp (`algo.overlong_adaptive`, beyond the paper): at rollout step s the ramp of Eq. 13
starts at the `percentile`-th percentile (an observed length, numpy's "higher" method) of the
response lengths generated in steps [s − window, s), i.e. L_cache = max_len − that length, clamped
to [0, max_len]; with no lengths recorded yet (the first step) the configured L_cache is used. The
history goes into the checkpoint, so a resumed run uses the same ramp. All rounds of a step share
one L_cache, and the history holds lengths gathered over all hosts, so every host shapes rewards
identically. The rule follows the policy: when lengths grow towards max_len the ramp narrows (fewer
long, correct answers penalized); when they shrink it widens. Since the longest (100 − percentile)
% are always on the ramp, it also pulls lengths down a little each step; the ablation against the
fixed L_cache is what says whether that helps.
"""
import numbers
from typing import Mapping

import jax.numpy as jnp
import numpy as np

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


def adaptive_cache_len(history: Mapping[int, list], *, step: int, window: int,
                       percentile: float, max_len: int, fallback: int) -> int:
  """L_cache for `step` from `history` (step -> list of length arrays), per the module doc."""
  if not 0 <= percentile <= 100:
    raise ValueError(f"percentile: must be in [0, 100], got {percentile}")
  if not _is_int(window) or window < 1:
    raise ValueError(f"window: must be an int >= 1 (steps), got {window!r}")
  if not _is_int(max_len) or max_len <= 0:
    raise ValueError(f"max_len: must be a positive int (tokens), got {max_len!r}")
  recent = [np.ravel(x) for s, xs in history.items() if step - window <= s < step for x in xs]
  lengths = np.concatenate(recent) if recent else np.zeros((0,))
  if lengths.size == 0:
    return fallback
  start = int(np.percentile(lengths, percentile, method="higher"))
  return int(min(max(max_len - start, 0), max_len))


def record_lengths(history: Mapping[int, list], *, step: int, lengths, window: int) -> dict:
  """A new history with `lengths` added under `step` and steps older than `window` dropped."""
  out = {s: list(xs) for s, xs in history.items() if s >= step - window}
  out.setdefault(step, []).append(np.asarray(lengths, np.int64).copy())
  return out


def history_state(history: Mapping[int, list]) -> dict:
  """The length history as JSON (string step keys, nested int lists), for the checkpoint."""
  return {str(s): [np.asarray(x).tolist() for x in xs] for s, xs in history.items()}


def history_from_state(state: Mapping[str, list]) -> dict:
  """Inverse of history_state."""
  return {int(s): [np.asarray(x, np.int64) for x in xs] for s, xs in state.items()}


def _is_int(x) -> bool:
  return isinstance(x, numbers.Integral) and not isinstance(x, bool)
