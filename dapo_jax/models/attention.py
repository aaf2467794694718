"""Training attention without a [B, T, T] mask: blocked online softmax, or a Pallas kernel.

Both take segment ids: query t sees key s iff s <= t and q_seg[t] == kv_seg[s]. Packed rows
(several sequences per row, `train/packing.py`) pass the same ids for both; a right-padded row
passes q_seg = 1 and kv_seg = its mask, which is the plain path's `causal & mask[s]`.

- `blocked_attend` (CPU, and the reference): blocks of `block` queries against blocks of
  `block` keys with a running max and sum (flash attention), key blocks past the diagonal never
  computed (causal skipping: ~half the work of the dense form). A custom VJP recomputes each
  block's probabilities from the saved log-sum-exp, so training memory is one block of scores
  per (batch, head), not [T, T]. Equal to `layers.attend` in values and gradients (tests).
- `splash_attend` (TPU): the Pallas splash-attention kernel with a causal mask and segment ids,
  under `shard_map` over the batch and head axes of the mesh (a Pallas call does not partition
  itself; `attention_shard.py`).
- `attention_gpu.gpu_flash_attend` (GPU): the Pallas GPU (Triton) flash-attention kernel shipped
  with jax, the same way.
`auto_impl` says which one "auto" runs on each platform.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from dapo_jax.models import attention_gpu
from dapo_jax.models import attention_shard as shard
from dapo_jax.models.config import ATTENTION_IMPLS as IMPLS
_MASKED = -1e30
_F32 = jnp.float32


def _layout(q, k, v, q_seg, kv_seg, block):
  """Pads T to whole blocks; q -> [B, Kv, G, Tp, D], k / v -> [B, Kv, Tp, D]. Padded queries
  (seg -1) and keys (seg -2) match nothing."""
  b, t, h, d = q.shape
  kv = k.shape[2]
  pad = -t % block
  tp = ((0, 0), (0, pad), (0, 0), (0, 0))
  qh = jnp.pad(q, tp).reshape(b, t + pad, kv, h // kv, d).transpose(0, 2, 3, 1, 4)
  kh, vh = (jnp.pad(x, tp).transpose(0, 2, 1, 3) for x in (k, v))
  qs = jnp.pad(q_seg, ((0, 0), (0, pad)), constant_values=-1)
  ks = jnp.pad(kv_seg, ((0, 0), (0, pad)), constant_values=-2)
  return qh, kh, vh, qs, ks


def _block(x, i, block, axis):
  return jax.lax.dynamic_slice_in_dim(x, i * block, block, axis=axis)


def _scores(q_i, k_j, qs_i, ks_j, i, j, block):
  """Scaled scores of query block i vs key block j [B, Kv, G, bq, bk] and what is visible."""
  s = jnp.einsum("bngqd,bnkd->bngqk", q_i, k_j, preferred_element_type=_F32)
  s = s * (1.0 / math.sqrt(q_i.shape[-1]))
  q_pos = i * block + jnp.arange(block)
  k_pos = j * block + jnp.arange(block)
  ok = (k_pos[None, :] <= q_pos[:, None])[None] & (qs_i[:, :, None] == ks_j[:, None, :])
  ok = ok[:, None, None]
  return jnp.where(ok, s, _MASKED), ok


def _forward(qh, kh, vh, qs, ks, block):
  """(out [B, Kv, G, Tp, D] float32, log-sum-exp [B, Kv, G, Tp]) by query blocks."""
  n = qh.shape[3] // block

  def row(i):
    q_i, qs_i = _block(qh, i, block, 3), _block(qs, i, block, 1)

    def step(j, carry):
      m, l, acc = carry
      s, _ = _scores(q_i, _block(kh, j, block, 2), qs_i, _block(ks, j, block, 1), i, j, block)
      m_new = jnp.maximum(m, jnp.max(s, axis=-1))
      p = jnp.exp(s - m_new[..., None])
      corr = jnp.exp(m - m_new)
      pv = jnp.einsum("bngqk,bnkd->bngqd", p.astype(vh.dtype), _block(vh, j, block, 2),
                      preferred_element_type=_F32)
      return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + pv

    shape = q_i.shape[:-1]
    init = (jnp.full(shape, _MASKED, _F32), jnp.zeros(shape, _F32),
            jnp.zeros(q_i.shape, _F32))
    m, l, acc = jax.lax.fori_loop(0, i + 1, step, init)  # key blocks j <= i only
    return acc / l[..., None], m + jnp.log(l)

  o_n, lse_n = jax.lax.map(row, jnp.arange(n))
  return _merge(o_n), _merge(lse_n)


def _merge(x_n):
  """[n, B, Kv, G, block, ...] -> [B, Kv, G, n * block, ...]."""
  x = jnp.moveaxis(x_n, 0, 3)
  return x.reshape(*x.shape[:3], -1, *x.shape[5:])


def _unlayout(oh, t, dtype):
  """[B, Kv, G, Tp, D] -> [B, T, H, D]."""
  b, kv, g, _, d = oh.shape
  return oh.transpose(0, 3, 1, 2, 4)[:, :t].reshape(b, t, kv * g, d).astype(dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def blocked_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, block: int):
  """Causal grouped-query attention with segment ids, by blocks of `block` positions."""
  return _blocked_fwd(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, block)[0]


def _blocked_fwd(q, k, v, q_seg, kv_seg, block):
  qh, kh, vh, qs, ks = _layout(q, k, v, q_seg, kv_seg, block)
  oh, lse = _forward(qh, kh, vh, qs, ks, block)
  return _unlayout(oh, q.shape[1], q.dtype), (q, k, v, q_seg, kv_seg, oh, lse)


def _blocked_bwd(block, res, do_BxTxHxK):
  """Flash-attention backward: for each key block j, the query blocks i >= j."""
  q, k, v, q_seg, kv_seg, oh, lse = res
  qh, kh, vh, qs, ks = _layout(q, k, v, q_seg, kv_seg, block)
  doh = _layout(do_BxTxHxK, k, v, q_seg, kv_seg, block)[0].astype(_F32)
  delta = jnp.sum(doh * oh, axis=-1)
  n = qh.shape[3] // block
  scale = 1.0 / math.sqrt(q.shape[-1])

  def column(dq, j):
    k_j, v_j, ks_j = _block(kh, j, block, 2), _block(vh, j, block, 2), _block(ks, j, block, 1)

    def step(i, carry):
      dq, dk, dv = carry
      q_i, do_i = _block(qh, i, block, 3), _block(doh, i, block, 3)
      s, ok = _scores(q_i, k_j, _block(qs, i, block, 1), ks_j, i, j, block)
      p = jnp.where(ok, jnp.exp(s - _block(lse, i, block, 3)[..., None]), 0.0)
      dp = jnp.einsum("bngqd,bnkd->bngqk", do_i, v_j, preferred_element_type=_F32)
      ds = p * (dp - _block(delta, i, block, 3)[..., None]) * scale
      dv = dv + jnp.einsum("bngqk,bngqd->bnkd", p, do_i)
      dk = dk + jnp.einsum("bngqk,bngqd->bnkd", ds, q_i, preferred_element_type=_F32)
      dq_i = _block(dq, i, block, 3) + jnp.einsum("bngqk,bnkd->bngqd", ds, k_j,
                                                  preferred_element_type=_F32)
      return jax.lax.dynamic_update_slice_in_dim(dq, dq_i, i * block, axis=3), dk, dv

    zeros = jnp.zeros(k_j.shape, _F32)
    dq, dk, dv = jax.lax.fori_loop(j, n, step, (dq, zeros, zeros))
    return dq, (dk, dv)

  dq, (dk_n, dv_n) = jax.lax.scan(column, jnp.zeros(qh.shape, _F32), jnp.arange(n))
  t = q.shape[1]
  dk, dv = (jnp.moveaxis(x, 0, 2).reshape(*x.shape[1:3], -1, x.shape[-1])
            .transpose(0, 2, 1, 3)[:, :t].astype(k.dtype) for x in (dk_n, dv_n))
  return _unlayout(dq, t, q.dtype), dk, dv, None, None


blocked_attend.defvjp(_blocked_fwd, _blocked_bwd)


def plain_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, chunk: int):
  """The dense reference: builds the [B, T, T] visibility and calls `layers.chunked_attend`."""
  from dapo_jax.models import layers  # pylint: disable=g-import-not-at-top
  t = q_BxTxHxK.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))[None]
  allowed = causal & (q_seg_BxT[:, :, None] == kv_seg_BxT[:, None, :])
  return layers.chunked_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, allowed, chunk=chunk)


def _splash_local(q, k, v, q_seg, kv_seg, *, row_by_row: bool):
  """One shard's splash attention: q [b, T, h, D], k / v [b, T, kv, D] (T a multiple of 128).
  row_by_row: one kernel call per row (`lax.map`) instead of `vmap`, whose extra grid dimension
  the TPU interpreter rejects (jax 0.10.2: it is not added to the kernel's dimension semantics)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as sk, splash_attention_mask as sm)
  t, h = q.shape[1], q.shape[2]
  blk = next(s for s in (512, 256, 128) if t % s == 0)
  sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                        block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                        block_kv_dq=blk)
  kernel = sk.make_splash_mha(sm.MultiHeadMask([sm.CausalMask((t, t))] * h), block_sizes=sizes,
                              head_shards=1, q_seq_shards=1)
  scale = 1.0 / math.sqrt(q.shape[-1])

  def one(rows):  # [T, h, D] -> the kernel's [h, T, D]
    q, k, v, qs, ks = rows
    o = kernel((q * scale).astype(q.dtype).swapaxes(0, 1), k.swapaxes(0, 1), v.swapaxes(0, 1),
               segment_ids=sk.SegmentIds(q=qs, kv=ks))
    return o.swapaxes(0, 1)

  rows = (q, k, v, q_seg, kv_seg)
  return jax.lax.map(one, rows) if row_by_row else jax.vmap(one)(rows)


def splash_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, mesh):
  """`blocked_attend`'s maths by the Pallas splash kernel, one call per (batch, head) shard.
  Off TPU it runs only under `pltpu.force_tpu_interpret_mode()` (tests), row by row."""
  tpu = shard.platform(mesh) == "tpu"
  if not tpu:
    shard.check_tpu_interpretable(mesh, "splash attention")
  local = functools.partial(_splash_local, row_by_row=not tpu)
  return shard.sharded_attend(local, q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT,
                              mesh=mesh, multiple=128, name="splash attention")


def auto_impl(platform: str) -> str:
  """What "auto" runs on a mesh of `platform` devices: the fused kernel that honours causal
  masking and segment ids there (splash on TPU, the Pallas GPU flash kernel on GPU), else the
  blocked XLA attention. (cuDNN's fused attention is not used: `jax.nn.dot_product_attention`
  takes packing's segments only as a dense [B, 1, T, T] mask, and no float32.)"""
  return {"tpu": "splash", "gpu": "gpu_flash"}.get(platform, "blocked")


def resolve(impl: str, mesh) -> str:
  """The implementation `attend` runs (`auto_impl` of the mesh's platform for "auto")."""
  if impl not in IMPLS:
    raise ValueError(f"config.model.attention_impl: must be one of {IMPLS}, got {impl!r}")
  if impl == "auto":
    return "blocked" if mesh is None else auto_impl(shard.platform(mesh))
  if impl in ("splash", "gpu_flash") and mesh is None:
    raise ValueError(f"config.model.attention_impl={impl} needs the device mesh")
  return impl


def attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, impl: str, block: int,
           mesh=None):
  """Causal self-attention with segment ids by the chosen implementation (`resolve`)."""
  impl = resolve(impl, mesh)
  args = (q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT)
  if impl == "splash":
    return splash_attend(*args, mesh=mesh)
  if impl == "gpu_flash":
    return attention_gpu.gpu_flash_attend(*args, mesh=mesh)
  if impl == "plain":
    return plain_attend(*args, chunk=block)
  return blocked_attend(*args, min(block, max(q_BxTxHxK.shape[1], 1)))
