"""Padding-free updates: a mini-batch's (prompt, response) rows packed into rows of S tokens.

A mini-batch of B sequences (right-padded rows [prompt][response][pad] of S = seq_len tokens)
is split by `train_step` into k micro-batches of R = B / k rows, micro-batch i holding rows
i, i + k, i + 2k, ... Packing keeps that frame and fills it differently: the sequences are
placed first-fit-decreasing by length into rows of S tokens, packed row p (in the order rows
are opened) goes to micro-batch p // R, and the update and the log-prob pass run only the
micro-batches that hold a row (`num_micro`). Each packed row carries segment ids (1, 2, ...
per sequence, 0 = padding) and per-segment positions, so attention and RoPE see every sequence
as if it were alone (`models/attention.py`). The loss is computed on the padded per-sequence
arrays, so its (sum, count) form, the token-mean denominator and every metric are those of the
padded layout (tests: equal to 1e-5).

A plan is a `PackPlan` (B-leading arrays, so slicing a mini-batch's rows slices its plan).
Without packing (`enabled=False`) the plan is the identity: sequence b is packed row b.
"""
import dataclasses
from typing import Any

import jax
import numpy as np


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackPlan:
  """Where a mini-batch's sequences sit in the packed rows (host numpy or device arrays)."""
  tokens_BxS: Any     # int32 the packed rows (rows i, i + k, ... are micro-batch i's)
  segments_BxS: Any   # int32 segment id of each position (1, 2, ... per sequence; 0 = padding)
  positions_BxS: Any  # int32 position of each token within its sequence
  src_BxS: Any        # int32 sequence b's column t lives at src[b, t] of its micro-batch's
                      # flattened [R * S] packed rows (0 past the sequence's end: masked)
  micro_B: Any        # int32 the micro-batch holding sequence b


def concat(plans) -> PackPlan:
  """The plans of consecutive mini-batches as one plan over all their rows (host)."""
  return jax.tree.map(lambda *xs: np.concatenate(xs), *plans)


def first_fit(lengths_B, row_len: int) -> tuple[np.ndarray, np.ndarray]:
  """(row_B, offset_B): first-fit decreasing placement of sequences into rows of row_len."""
  lengths = np.asarray(lengths_B, np.int64)
  if lengths.size and (lengths.max() > row_len or lengths.min() < 1):
    raise ValueError(f"packing: sequence lengths must be in [1, {row_len}], got "
                     f"[{lengths.min()}, {lengths.max()}]")
  row, offset = np.zeros(len(lengths), np.int64), np.zeros(len(lengths), np.int64)
  used = np.zeros(len(lengths), np.int64)  # tokens in each opened row (at most B rows)
  rows = 0
  for b in np.argsort(-lengths, kind="stable"):
    fits = np.flatnonzero(used[:rows] + lengths[b] <= row_len)
    r = int(fits[0]) if fits.size else rows
    rows = max(rows, r + 1)
    row[b], offset[b] = r, used[r]
    used[r] += lengths[b]
  return row, offset


def _placement(lengths_B, *, row_len: int, k: int, enabled: bool):
  """(flat packed row, micro-batch, offset) of every sequence."""
  b = len(lengths_B)
  if not enabled:
    seq = np.arange(b)
    return seq, seq % k, np.zeros(b, np.int64)
  row, offset = first_fit(lengths_B, row_len)
  r_per_micro = b // k
  micro, local = row // r_per_micro, row % r_per_micro
  return local * k + micro, micro, offset


def pack(tokens_BxS, attn_mask_BxS, *, micro_batches: int, enabled: bool = True) -> PackPlan:
  """The packing plan of one mini-batch."""
  tokens, mask = np.asarray(tokens_BxS), np.asarray(attn_mask_BxS) > 0
  b, s = tokens.shape
  if micro_batches < 1 or b % micro_batches:
    raise ValueError(f"packing: {micro_batches} micro-batches do not divide {b} sequences")
  lengths = mask.sum(axis=1)
  if not (mask == (np.arange(s)[None, :] < lengths[:, None])).all():
    raise ValueError("packing: attn_mask rows must be a run of real tokens from column 0")
  flat, micro, offset = _placement(lengths, row_len=s, k=micro_batches, enabled=enabled)
  t_BxS = np.arange(s)[None, :]
  col_BxS = offset[:, None] + t_BxS
  rows_BxS = np.broadcast_to(flat[:, None], (b, s))
  seg = np.zeros(b, np.int64)  # 1 + the sequences already in the row
  order = np.lexsort((offset, flat))
  seg[order] = 1 + np.arange(b) - np.searchsorted(flat[order], flat[order])
  rows = []
  for value in (tokens, np.broadcast_to(seg[:, None], (b, s)), np.broadcast_to(t_BxS, (b, s))):
    row = np.zeros((b, s), np.int32)
    row[rows_BxS[mask], col_BxS[mask]] = value[mask]
    rows.append(row)
  src = (flat // micro_batches)[:, None] * s + col_BxS
  return PackPlan(*rows, src_BxS=np.where(mask, src, 0).astype(np.int32),
                  micro_B=micro.astype(np.int32))


def num_micro(pack_micro_B) -> int:
  """Micro-batches that hold a sequence (the update runs only these)."""
  return int(np.max(pack_micro_B)) + 1


def unpack(values_BxS, plan: PackPlan, attn_mask_BxS, *, micro_batches: int) -> np.ndarray:
  """Per-sequence [B, S] values from values on the packed rows [B, S] (host)."""
  b, s = values_BxS.shape
  local = plan.src_BxS // s
  flat = local * micro_batches + plan.micro_B[:, None]
  out = values_BxS[flat, plan.src_BxS % s]
  return np.where(np.asarray(attn_mask_BxS) > 0, out, 0).astype(values_BxS.dtype)


def to_rows(values_BxSxF, plan: PackPlan, attn_mask_BxS, *, micro_batches: int,
            fill) -> np.ndarray:
  """Inverse of `unpack`: per-sequence [B, S, ...] values placed on the packed rows [B, S, ...]
  (host), `fill` where no sequence's token is."""
  values = np.asarray(values_BxSxF)
  b, s = values.shape[:2]
  mask = np.asarray(attn_mask_BxS) > 0
  flat = (plan.src_BxS // s) * micro_batches + plan.micro_B[:, None]
  out = np.full(values.shape, fill, values.dtype)
  out[flat[mask], plan.src_BxS[mask] % s] = values[mask]
  return out


def identity_plan(tokens_BxS, attn_mask_BxS, *, micro_batches: int) -> PackPlan:
  """`pack(..., enabled=False)` on device, for a mini-batch given without a plan (jnp)."""
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from dapo_jax.models.qwen2 import default_positions  # pylint: disable=g-import-not-at-top
  b, s = tokens_BxS.shape
  seq_B = jnp.arange(b)
  real = attn_mask_BxS > 0
  src = (seq_B // micro_batches)[:, None] * s + jnp.arange(s)[None, :]
  return PackPlan(tokens_BxS=tokens_BxS.astype(jnp.int32), segments_BxS=real.astype(jnp.int32),
                  positions_BxS=default_positions(real),
                  src_BxS=jnp.where(real, src, 0).astype(jnp.int32),
                  micro_B=(seq_B % micro_batches).astype(jnp.int32))
