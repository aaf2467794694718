"""Training attention without a [B, T, T] mask: blocked online softmax, or a Pallas kernel.

Both take segment ids: query t sees key s iff s <= t and q_seg[t] == kv_seg[s]. Packed rows
(several sequences per row, `train/packing.py`) pass the same ids for both; a right-padded row
passes q_seg = 1 and kv_seg = its mask, which is the plain path's `causal & mask[s]`.

- `blocked_attend` (CPU, and the reference; `attention_blocked.py`): blocks of `block` queries against blocks of
  `block` keys with a running max and sum (flash attention), key blocks past the diagonal never
  computed (causal skipping: ~half the work of the dense form). A custom VJP recomputes each
  block's probabilities from the saved log-sum-exp, so training memory is one block of scores
  per (batch, head), not [T, T]. Equal to `layers.attend` in values and gradients (tests).
- `splash_attend` (TPU): the Pallas splash-attention kernel with a causal mask and segment ids,
  under `shard_map` over the batch and head axes of the mesh (a Pallas call does not partition
  itself; `attention_shard.py`).
- `attention_gpu.gpu_flash_attend` (GPU): the Pallas GPU (Triton) flash-attention kernel shipped
  with jax, the same way.
`auto_impl` says which one "auto" runs on each platform. With a context axis on the mesh
(`mesh.context` > 1) the blocked and splash paths run per (batch, context, head) shard, each
shard's queries against the whole row's gathered keys (`attention_shard.sharded_attend`).
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from dapo_jax import sharding
from dapo_jax.models import attention_gpu
from dapo_jax.models import attention_shard as shard
from dapo_jax.models.attention_blocked import blocked_attend, offset_attend
from dapo_jax.models.config import ATTENTION_IMPLS as IMPLS

# The implementations that run with the time axis split over the mesh's context axis.
CONTEXT_IMPLS = ("auto", "blocked", "splash")

__all__ = ["CONTEXT_IMPLS", "attend", "auto_impl", "blocked_attend", "plain_attend", "resolve",
           "splash_attend"]


def plain_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, chunk: int):
  """The dense reference: builds the [B, T, T] visibility and calls `layers.chunked_attend`."""
  from dapo_jax.models import layers  # pylint: disable=g-import-not-at-top
  t = q_BxTxHxK.shape[1]
  causal = jnp.tril(jnp.ones((t, t), bool))[None]
  allowed = causal & (q_seg_BxT[:, :, None] == kv_seg_BxT[:, None, :])
  return layers.chunked_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, allowed, chunk=chunk)


def _splash_local(q, k, v, q_seg, kv_seg, *, row_by_row: bool, context=None):
  """One shard's splash attention: q [b, T, h, D], k / v [b, S, kv, D] (T, S multiples of 128;
  S = T but with context parallelism, whose shard `context.index` holds queries at offset
  index x T of the keys: one kernel per offset, the shard's picked by `lax.switch`).
  row_by_row: one kernel call per row (`lax.map`) instead of `vmap`, whose extra grid dimension
  the TPU interpreter rejects (jax 0.10.2: it is not added to the kernel's dimension semantics)."""
  from jax.experimental.pallas.ops.tpu.splash_attention import (  # pylint: disable=g-import-not-at-top
      splash_attention_kernel as sk, splash_attention_mask as sm)
  t, s, h = q.shape[1], k.shape[1], q.shape[2]
  blk = next(b for b in (512, 256, 128) if t % b == 0)
  sizes = sk.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                        block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                        block_kv_dq=blk)
  kernel = lambda offset: sk.make_splash_mha(  # noqa: E731
      sm.MultiHeadMask([sm.CausalMask((t, s), offset=offset)] * h), block_sizes=sizes,
      head_shards=1, q_seq_shards=1)
  scale = 1.0 / math.sqrt(q.shape[-1])

  def run(kernel_, rows):
    def one(row):  # [T, h, D] -> the kernel's [h, T, D]
      q, k, v, qs, ks = row
      o = kernel_((q * scale).astype(q.dtype).swapaxes(0, 1), k.swapaxes(0, 1),
                  v.swapaxes(0, 1), segment_ids=sk.SegmentIds(q=qs, kv=ks))
      return o.swapaxes(0, 1)
    return jax.lax.map(one, rows) if row_by_row else jax.vmap(one)(rows)

  rows = (q, k, v, q_seg, kv_seg)
  if context is None:
    return run(kernel(0), rows)
  branches = [functools.partial(run, kernel(i * t)) for i in range(context.count)]
  return jax.lax.switch(context.index, branches, rows)


def _blocked_local(q, k, v, q_seg, kv_seg, *, block: int, context):
  """One context shard's blocked attention: its queries at offset index x T of the keys."""
  return offset_attend(q, k, v, q_seg, kv_seg, context.index * q.shape[1], block)


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
  context = sharding.context_size(mesh)
  if context > 1 and impl not in CONTEXT_IMPLS:
    raise ValueError(f"config.model.attention_impl={impl} does not run context-parallel "
                     f"(mesh.context={context}); use one of {CONTEXT_IMPLS}")
  if impl == "splash":
    return splash_attend(*args, mesh=mesh)
  if impl == "gpu_flash":
    return attention_gpu.gpu_flash_attend(*args, mesh=mesh)
  if impl == "plain":
    return plain_attend(*args, chunk=block)
  if context > 1:
    block = min(block, max(-(-q_BxTxHxK.shape[1] // context), 1))
    return shard.sharded_attend(functools.partial(_blocked_local, block=block), *args,
                                mesh=mesh, multiple=block, name="blocked attention")
  return blocked_attend(*args, min(block, max(q_BxTxHxK.shape[1], 1)))
