"""Training attention on GPU: the Pallas GPU (Triton) flash-attention kernel shipped with jax
(`jax.experimental.pallas.ops.gpu.attention.mha`, forward and backward kernels), causal with
segment ids, one call per (batch, head) shard of the mesh (`attention_shard.sharded_attend`).

The kernel takes one segment-id array for queries and keys alike, so a query t sees key s iff
s <= t and seg[t] == seg[s], with seg = the key segments. That is `blocked_attend`'s rule for
every query whose own key it may see (q_seg[t] == kv_seg[t]): all of a packed row, and every
real token of a right-padded row (q_seg = 1, kv_seg = mask). A padded query of such a row sees
the padding before it instead of the real tokens: a value no loss reads, and no real query
sees a padded key either way. The kernel has no grouped-query form, so K / V are repeated over
each group's query heads (the gradient sums them back). Off a GPU it runs in Pallas' interpret
mode (tests on CPU).
"""
from __future__ import annotations

import functools
import math

import jax.numpy as jnp

from dapo_jax.models import attention_shard as shard

MIN_HEAD_DIM = 16  # the kernel's matmuls need a contraction of >= 16 (Triton's dot)


def flash_block(t: int, row_bytes: int = 256) -> int:
  """Query / key block of the forward kernel: 128 (jax's default), 64 when one row of a tile
  (head_dim x itemsize) is 512 bytes or more (float32 at head_dim 128: the q, k and v tiles of
  128 rows, double-buffered, would pass the 228 KiB of shared memory of an H100 / H200 SM), or
  for short rows the smallest power of two >= T and >= 16 (the kernel needs T a multiple)."""
  top = 128 if row_bytes < 512 else 64
  return top if t >= top else max(16, 1 << (t - 1).bit_length())


def _flash_local(q, k, v, q_seg, kv_seg, *, block: int, interpret: bool):
  """One shard: q [b, T, h, D], k / v [b, T, kv, D], T a multiple of `block`."""
  del q_seg  # one id array for both sides: the keys' (see the module doc)
  from jax.experimental.pallas.ops.gpu import attention as pallas_gpu  # pylint: disable=g-import-not-at-top
  h, kv, d = q.shape[2], k.shape[2], q.shape[3]
  k, v = (jnp.repeat(x, h // kv, axis=2) for x in (k, v))
  pad = ((0, 0), (0, 0), (0, 0), (0, max(MIN_HEAD_DIM - d, 0)))  # zeros change no score
  q, k, v = (jnp.pad(x, pad) for x in (q, k, v))
  small = min(32, block)  # jax's default backward blocks
  sizes = pallas_gpu.BlockSizes(block_q=block, block_k=block, block_q_dkv=small,
                                block_kv_dkv=small, block_q_dq=small, block_kv_dq=small)
  o = pallas_gpu.mha(q, k, v, kv_seg, sm_scale=1.0 / math.sqrt(d), causal=True,
                     block_sizes=sizes, interpret=interpret)
  return o[..., :d]


def gpu_flash_attend(q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, mesh):
  """`blocked_attend`'s maths (see the module doc for padded queries) by the Pallas GPU flash
  kernel, under `shard_map` over the mesh's batch and head axes."""
  row_bytes = max(q_BxTxHxK.shape[3], MIN_HEAD_DIM) * q_BxTxHxK.dtype.itemsize
  block = flash_block(q_BxTxHxK.shape[1], row_bytes)
  local = functools.partial(_flash_local, block=block,
                            interpret=shard.platform(mesh) != "gpu")
  return shard.sharded_attend(local, q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT,
                              mesh=mesh, multiple=block, name="gpu_flash attention")
