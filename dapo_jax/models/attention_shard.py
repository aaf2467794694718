"""Runs a per-shard attention over a device mesh: `shard_map` over the mesh's batch, context
and head axes, the time axis padded to the kernel's block multiple (a Pallas call does not
partition itself; the blocked XLA attention comes here only for context parallelism).

Context parallelism (`mesh.context` > 1, the mesh's `context` axis): every shard holds a
contiguous 1/c of each row's queries, keys and values; it gathers the keys, values and key
segments of the whole row from the other shards (one all-gather per layer, whose transpose in
the backward pass is a reduce-scatter of their gradients) and attends its queries, which sit at
offset shard x T/c of the row, to them. An all-gather rather than a ring: with grouped-query
attention K and V are a fraction of Q (Qwen2.5-32B: 8 KV heads for 40 query heads), packing's
segment ids need no per-step mask bookkeeping, and the gathered K/V live one layer at a time
(the choice of Llama 3's context parallelism, arXiv 2407.21783, section 3.3.2).

Used by the TPU splash kernel (`attention.splash_attend`), the GPU flash kernel
(`attention_gpu.gpu_flash_attend`) and, with a context axis, the blocked attention; `check_tpu_interpretable` guards the TPU kernels'
interpret mode on CPU meshes (also used by `paged.attend_kernel`).
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dapo_jax import sharding


def platform(mesh) -> str:
  """The mesh's device platform: "cpu", "gpu" or "tpu"."""
  return mesh.devices.flat[0].platform


def check_tpu_interpretable(mesh, what: str):
  """A Pallas TPU kernel runs on a CPU mesh only in interpret mode, whose host callbacks can
  deadlock (jax 0.10.2) when every CPU device of the process runs the kernel at once: each
  device's thread blocks in a callback waiting for its buffer's copy to CPU device 0, which
  needs a free thread of the same pool (splash at T = 256 hung on 2 of 2, 4 of 4 and 8 of 8
  devices and ran on 4 of 5, 7 of 8, 8 of 16 and 1 of 1). Refused here rather than hung."""
  if platform(mesh) != "cpu":
    return
  here = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
  if 1 < len(here) >= jax.local_device_count("cpu"):
    raise ValueError(
        f"{what}: Pallas TPU interpret mode on a CPU mesh of all {len(here)} CPU devices of the "
        "process can deadlock; use a mesh that leaves one CPU device idle (e.g. "
        f"--xla_force_host_platform_device_count={len(here) + 1})")


def head_specs(q_BxTxHxK, k_BxTxKvxK, mesh, name: str):
  """(q spec, k / v spec, segment spec) over the mesh: batch over its batch axes, time over
  context, query and KV heads over tensor, which must split both the same way (each shard holds
  whole groups)."""
  spec = lambda x, names: sharding.logical_to_mesh_sharding(names, mesh, shape=x.shape).spec
  q_spec = spec(q_BxTxHxK, ("batch", "seq", "heads", None))
  kv_spec = spec(k_BxTxKvxK, ("batch", "seq", "kv_heads", None))
  if q_spec[2] != kv_spec[2]:
    raise ValueError(f"{name}: query heads {q_BxTxHxK.shape[2]} and KV heads "
                     f"{k_BxTxKvxK.shape[2]} must split the same way over the mesh "
                     f"{dict(mesh.shape)} (got {q_spec} vs {kv_spec}); set "
                     "config.model.attention_impl=blocked")
  return q_spec, kv_spec, P(q_spec[0], q_spec[1])


@dataclasses.dataclass(frozen=True)
class ContextShard:
  """Which of the `count` context shards runs (`index`, traced): its queries sit at offset
  index x (its query count) of the gathered keys."""
  index: jax.Array
  count: int


def sharded_attend(local, q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK, q_seg_BxT, kv_seg_BxT, *, mesh,
                   multiple: int, name: str):
  """`local(q, k, v, q_seg, kv_seg)` on each (batch, head) shard, T padded to a multiple of
  `multiple` (of each context shard's length): padded queries (segment -1) and keys (-2) match
  nothing real and are cut off. With a context axis (module doc) `local` gets the keys, values
  and key segments of the whole row and `context=ContextShard(...)`."""
  t, c = q_BxTxHxK.shape[1], sharding.context_size(mesh)
  pad = -t % (multiple * c)
  tp = ((0, 0), (0, pad), (0, 0), (0, 0))
  q, k, v = (jnp.pad(x, tp) for x in (q_BxTxHxK, k_BxTxKvxK, v_BxTxKvxK))
  qs = jnp.pad(q_seg_BxT, ((0, 0), (0, pad)), constant_values=-1)
  ks = jnp.pad(kv_seg_BxT, ((0, 0), (0, pad)), constant_values=-2)
  q_spec, kv_spec, seg_spec = head_specs(q, k, mesh, name)
  if c > 1 and q_spec[1] != sharding.CONTEXT:
    raise ValueError(f"{name}: the time axis ({q.shape[1]}) does not split over the mesh's "
                     f"context axis {dict(mesh.shape)} (got {q_spec})")
  body = local
  if c > 1:
    def body(q, k, v, qs, ks):
      gather = lambda x: jax.lax.all_gather(x, sharding.CONTEXT, axis=1, tiled=True)
      shard = ContextShard(index=jax.lax.axis_index(sharding.CONTEXT), count=c)
      return local(q, gather(k), gather(v), qs, gather(ks), context=shard)
  out = jax.shard_map(body, mesh=mesh, in_specs=(q_spec, kv_spec, kv_spec, seg_spec, seg_spec),
                      out_specs=q_spec, check_vma=False)(q, k, v, qs, ks)
  return out[:, :t]
