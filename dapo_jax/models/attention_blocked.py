"""Blocked (flash) causal attention with segment ids in plain XLA: the CPU path and the
reference the kernels are tested against.

Blocks of `block` queries against blocks of `block` keys with a running max and sum, key blocks
past the diagonal never computed (causal skipping: about half the dense form's work). A custom
VJP recomputes each block's probabilities from the saved log-sum-exp, so training memory is one
block of scores per (batch, head), not [T, T].

The queries may be a slice of the keys' sequence: query q sits at position `q_offset + q` of
the key sequence (context parallelism, `attention_shard.sharded_attend`: each shard's queries
against the keys gathered from every shard). Query t sees key s iff s <= t and their segment
ids are equal; padded queries (segment -1) and keys (-2) match nothing.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

_MASKED = -1e30
_F32 = jnp.float32


def _pad_time(x, block, value=0):
  """x [B, T, ...] padded on T to whole blocks."""
  pad = -x.shape[1] % block
  return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2), constant_values=value)


def _layout(q, k, v, q_seg, kv_seg, block):
  """Pads T to whole blocks; q -> [B, Kv, G, Tq, D], k / v -> [B, Kv, Tk, D]."""
  b, _, h, d = q.shape
  kv = k.shape[2]
  qp = _pad_time(q, block)
  qh = qp.reshape(b, qp.shape[1], kv, h // kv, d).transpose(0, 2, 3, 1, 4)
  kh, vh = (_pad_time(x, block).transpose(0, 2, 1, 3) for x in (k, v))
  return qh, kh, vh, _pad_time(q_seg, block, -1), _pad_time(kv_seg, block, -2)


def _block(x, i, block, axis):
  return jax.lax.dynamic_slice_in_dim(x, i * block, block, axis=axis)


def _scores(q_i, k_j, qs_i, ks_j, i, j, block, q_offset):
  """Scaled scores of query block i vs key block j [B, Kv, G, bq, bk] and what is visible."""
  s = jnp.einsum("bngqd,bnkd->bngqk", q_i, k_j, preferred_element_type=_F32)
  s = s * (1.0 / math.sqrt(q_i.shape[-1]))
  q_pos = q_offset + i * block + jnp.arange(block)
  k_pos = j * block + jnp.arange(block)
  ok = (k_pos[None, :] <= q_pos[:, None])[None] & (qs_i[:, :, None] == ks_j[:, None, :])
  ok = ok[:, None, None]
  return jnp.where(ok, s, _MASKED), ok


def _forward(qh, kh, vh, qs, ks, q_offset, block):
  """(out [B, Kv, G, Tq, D] float32, log-sum-exp [B, Kv, G, Tq]) by query blocks."""
  nk = kh.shape[2] // block

  def row(i):
    q_i, qs_i = _block(qh, i, block, 3), _block(qs, i, block, 1)

    def step(j, carry):
      m, l, acc = carry
      s, _ = _scores(q_i, _block(kh, j, block, 2), qs_i, _block(ks, j, block, 1), i, j, block,
                     q_offset)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.exp(s - m_new[..., None])
      corr = jnp.exp(m - m_new)
      pv = jnp.einsum("bngqk,bnkd->bngqd", p.astype(vh.dtype), _block(vh, j, block, 2),
                      preferred_element_type=_F32)
      return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

    shape = q_i.shape[:-1]
    init = (jnp.full(shape, _MASKED, _F32), jnp.zeros(shape, _F32),
            jnp.zeros(q_i.shape, _F32))
    last = (q_offset + (i + 1) * block - 1) // block  # the key block of the row's last query
    m, l, acc = jax.lax.fori_loop(0, jnp.minimum(nk, last + 1), step, init)
    return acc / l[..., None], m + jnp.log(l)

  o_n, lse_n = jax.lax.map(row, jnp.arange(qh.shape[3] // block))
  return _merge(o_n), _merge(lse_n)


def _merge(x_n):
  """[n, B, Kv, G, block, ...] -> [B, Kv, G, n * block, ...]."""
  x = jnp.moveaxis(x_n, 0, 3)
  return x.reshape(*x.shape[:3], -1, *x.shape[5:])


def _unlayout(oh, t, dtype):
  """[B, Kv, G, Tp, D] -> [B, T, H, D]."""
  b, kv, g, _, d = oh.shape
  return oh.transpose(0, 3, 1, 2, 4)[:, :t].reshape(b, t, kv * g, d).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def offset_attend(q_BxTxHxK, k_BxSxKvxK, v_BxSxKvxK, q_seg_BxT, kv_seg_BxS, q_offset,
                  block: int):
  """Causal grouped-query attention of queries at positions q_offset + [0, T) of the keys'
  sequence (S keys), with segment ids, by blocks of `block` positions."""
  return _fwd(q_BxTxHxK, k_BxSxKvxK, v_BxSxKvxK, q_seg_BxT, kv_seg_BxS, q_offset, block)[0]


def blocked_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, block: int):
  """Causal grouped-query attention with segment ids, by blocks of `block` positions."""
  return offset_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, 0, block)


def _fwd(q, k, v, q_seg, kv_seg, q_offset, block):
  qh, kh, vh, qs, ks = _layout(q, k, v, q_seg, kv_seg, block)
  oh, lse = _forward(qh, kh, vh, qs, ks, q_offset, block)
  return _unlayout(oh, q.shape[1], q.dtype), (q, k, v, q_seg, kv_seg, q_offset, oh, lse)


def _bwd(block, res, do_BxTxHxK):
  """Flash-attention backward: for each key block j, the query blocks that can see it."""
  q, k, v, q_seg, kv_seg, q_offset, oh, lse = res
  qh, kh, vh, qs, ks = _layout(q, k, v, q_seg, kv_seg, block)
  doh = _layout(do_BxTxHxK, k, v, q_seg, kv_seg, block)[0].astype(_F32)
  delta = jnp.sum(doh * oh, axis=-1)
  nq = qh.shape[3] // block
  scale = 1.0 / math.sqrt(q.shape[-1])

  def column(dq, j):
    k_j, v_j, ks_j = _block(kh, j, block, 2), _block(vh, j, block, 2), _block(ks, j, block, 1)

    def step(i, carry):
      dq, dk, dv = carry
      q_i, do_i = _block(qh, i, block, 3), _block(doh, i, block, 3)
      s, ok = _scores(q_i, k_j, _block(qs, i, block, 1), ks_j, i, j, block, q_offset)
      p = jnp.where(ok, jnp.exp(s - _block(lse, i, block, 3)[..., None]), 0.0)
      dp = jnp.einsum("bngqd,bnkd->bngqk", do_i, v_j, preferred_element_type=_F32)
      ds = p * (dp - _block(delta, i, block, 3)[..., None]) * scale
      dv = dv + jnp.einsum("bngqk,bngqd->bnkd", p, do_i)
      dk = dk + jnp.einsum("bngqk,bngqd->bnkd", ds, q_i, preferred_element_type=_F32)
      dq_i = _block(dq, i, block, 3) + jnp.einsum("bngqk,bnkd->bngqd", ds, k_j,
                                                  preferred_element_type=_F32)
      return jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * block, axis=3), dk, dv

    zeros = jnp.zeros(k_j.shape, _F32)
    first = jnp.maximum(0, (j * block - q_offset) // block)  # the first query block seeing j
    dq, dk, dv = jax.lax.fori_loop(first, nq, step, (dq, zeros, zeros))
    return dq, (dk, dv)

  dq, (dk_n, dv_n) = jax.lax.scan(column, jnp.zeros(qh.shape, _F32),
                                  jnp.arange(kh.shape[2] // block))
  s = k.shape[1]
  dk, dv = (jnp.moveaxis(x, 0, 2).reshape(*x.shape[1:3], -1, x.shape[-1])
            .transpose(0, 2, 1, 3)[:, :s].astype(k.dtype) for x in (dk_n, dv_n))
  return _unlayout(dq, q.shape[1], q.dtype), dk, dv, None, None, None


offset_attend.defvjp(_fwd, _bwd)
