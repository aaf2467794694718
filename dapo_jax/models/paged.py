"""Paged KV cache for decode: one pool of fixed-size pages, a page table per sequence.

The pool {"k", "v"} is [Kv, L, N, page, Hd] (KV heads over `tensor`, pages over the batch
axes: each batch shard owns a contiguous range of N / shards pages, used only by its own
rows). A sequence at position p keeps its token's K/V in page `table[b, p // page]` at offset
`p % page`; table entries it does not hold point at its shard's null page (never allocated,
the write target of free rows). Decode attention reads only the pages a row holds:
- `attend_kernel` (TPU / GPU): the Pallas paged-attention kernel of the platform (`KERNELS`:
  jax's TPU kernel, or its GPU (Triton) kernel, which also splits a row's pages into
  partitions run in parallel), under `shard_map` so each chip runs it on its own rows, heads
  and pages; the layer is folded into the page index, so the stacked pool is passed as it
  lies, never copied per layer;
- `attend_reference` (elsewhere): gathers the row's pages up to the live bucket (the smallest
  of `layers.decode_buckets` holding every row's position, in pages) and attends, so cost
  follows the context as the dense cache does.
Both give the dense cache's numbers (tests/test_paged.py). The host side (which pages a row
holds) is `dapo_jax.rollout.pages`.
"""
from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from dapo_jax import sharding as sharding_lib
from dapo_jax.models import attention_shard
from dapo_jax.models import layers as L

# Logical axes of each pool array [Kv, L, N, page, Hd].
PAGE_AXES = ("kv_heads", "layers", "batch", None, "head_dim")
_MASKED = -1e30  # as models/layers.py: finite, so a row with no visible key is junk, not NaN


KERNELS = ("tpu", "gpu")  # the Pallas paged-attention kernels `attend_kernel` can run
GPU_BLOCK_H = 16  # query heads per block of the GPU kernel (its minimum; a group is padded)


@dataclasses.dataclass(frozen=True)
class PagedSpec:
  """Static facts of a paged decode: page size (tokens), the row length limit (max_len), and
  which attention runs: kernel "" = the reference gather, or one of `KERNELS` (on `mesh`,
  `pages_per_block` pages per block)."""
  page_size: int
  max_len: int
  kernel: str = ""
  mesh: object = None
  pages_per_block: int = 1

  def __post_init__(self):
    if self.kernel not in ("", *KERNELS):
      raise ValueError(f"PagedSpec.kernel: must be '' (reference) or one of {KERNELS}, got "
                       f"{self.kernel!r}")

  @property
  def pages_per_seq(self) -> int:
    return -(-self.max_len // self.page_size)

  @property
  def gpu_splits(self) -> int:
    """Partitions of a row's pages the GPU kernel runs in parallel (flash-decoding)."""
    blocks = self.pages_per_seq // self.pages_per_block
    return max(n for n in (16, 8, 4, 2, 1) if blocks % n == 0)


def init_pages(cfg, num_pages: int, page_size: int, dtype) -> dict:
  """Zero pool {"k", "v"}: [Kv, L, num_pages, page_size, Hd] each."""
  shape = (cfg.num_kv_heads, cfg.num_layers, num_pages, page_size, cfg.head_dim)
  return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype)}


def pages_sharding(mesh, shape):
  return sharding_lib.logical_to_mesh_sharding(PAGE_AXES, mesh, shape=shape)


def split_pages(pool) -> tuple[list, list]:
  """Stacked pool -> per-layer lists of [Kv, N, page, Hd] (the CPU decode loop's form)."""
  n = pool["k"].shape[1]
  return [pool["k"][:, i] for i in range(n)], [pool["v"][:, i] for i in range(n)]


def stack_pages(ks, vs) -> dict:
  return {"k": jnp.stack(ks, axis=1), "v": jnp.stack(vs, axis=1)}


def page_buckets(spec: PagedSpec) -> tuple[int, ...]:
  """Pages the reference path may read: the decode buckets (positions) rounded up to pages."""
  sizes = [-(-n // spec.page_size) for n in L.decode_buckets(spec.pages_per_seq * spec.page_size)]
  return tuple(sorted(set(sizes)))


def _gather(pages, layer, idx_BxN):
  """[Kv, B, n * page, Hd] of the given pages (of one layer of a stacked pool if layer)."""
  g = pages[:, idx_BxN] if layer is None else pages[:, layer, idx_BxN]  # [Kv, B, n, page, Hd]
  kv, b, n, ps, hd = g.shape
  return g.reshape(kv, b, n * ps, hd)


def attend_gathered(q_Bx1xHxK, k_KvxBxSxK, v_KvxBxSxK, allowed_BxS):
  """`layers.attend` for one query per row over keys laid out [Kv, B, S, K] (as gathered
  from the pool, so no transpose): (KV head, row) are the matmuls' batch dimensions and the
  query heads of a group their columns, the form XLA:CPU runs fastest (`layers.attend_one`)."""
  b, _, h, k = q_Bx1xHxK.shape
  kv, dt = k_KvxBxSxK.shape[0], k_KvxBxSxK.dtype
  q = q_Bx1xHxK.reshape(b, kv, h // kv, k).swapaxes(0, 1).astype(dt)  # [Kv, B, G, K]
  s = jnp.einsum("nbsk,nbgk->nbsg", k_KvxBxSxK, q, preferred_element_type=jnp.float32)
  s = jnp.where(allowed_BxS[None, :, :, None], s * (1.0 / math.sqrt(k)), _MASKED)
  p = jax.nn.softmax(s, axis=2).astype(dt)
  o = jnp.einsum("nbsg,nbsk->nbgk", p, v_KvxBxSxK, preferred_element_type=jnp.float32)
  return o.swapaxes(0, 1).reshape(b, 1, h, k).astype(q_Bx1xHxK.dtype)


def attend_reference(q_Bx1xHxK, k_pages, v_pages, table_BxP, positions_B, layer, spec):
  """Attention over the pages each row holds, up to the live bucket (see the module doc)."""
  sizes = page_buckets(spec)
  need = jnp.max(positions_B) // spec.page_size + 1
  bucket = jnp.minimum(jnp.searchsorted(jnp.asarray(sizes), need), len(sizes) - 1)

  def branch(q, kp, vp, table, pos, lay, *, n):
    k, v = _gather(kp, lay, table[:, :n]), _gather(vp, lay, table[:, :n])
    allowed_BxS = jnp.arange(n * spec.page_size)[None, :] <= pos[:, None]
    return attend_gathered(q, k, v, allowed_BxS)

  branches = [functools.partial(branch, n=n) for n in sizes]
  return jax.lax.switch(bucket, branches, q_Bx1xHxK, k_pages, v_pages, table_BxP, positions_B,
                        layer)


def _kernel_specs(spec: PagedSpec, num_heads: int, num_kv: int, stacked: bool):
  """shard_map specs: rows and pages over the batch axes, heads over tensor (when KV heads
  split over it, so every chip holds whole query groups)."""
  mesh = spec.mesh
  batch = tuple(a for a in ("data", "fsdp") if a in mesh.shape and mesh.shape[a] > 1) or None
  t = mesh.shape.get("tensor", 1)
  heads = "tensor" if t > 1 and num_kv % t == 0 and num_heads % t == 0 else None
  pool = P(heads, None, batch, None, None) if stacked else P(heads, batch, None, None)
  return batch, heads, pool


# The TPU kernel prefetches its call's whole page table [rows, pages per row] (int32) into the
# core's scalar memory, 1 MiB on v5p: Qwen3-30B-A3B's decode on v5p-64 (256 rows a chip x 1,408
# pages = 1.4 MB) failed to compile on it. A shard's rows go through the kernel in as few calls
# as keep each call's table within this bound (the rest of SMEM: lengths and the kernel's own).
TPU_TABLE_SMEM_BYTES = 768 * 1024


def tpu_row_calls(rows: int, pages_per_row: int) -> tuple[int, int]:
  """(kernel calls, rows per call) for a shard's `rows` so that each call's page table fits
  TPU_TABLE_SMEM_BYTES (one call when it all does)."""
  most = max(1, TPU_TABLE_SMEM_BYTES // (4 * pages_per_row))
  calls = -(-rows // most)
  return calls, -(-rows // calls)


def _tpu_kernel(q_BxHxK, k_pages, v_pages, lengths_B, table_BxP, spec):
  from jax.experimental.pallas.ops.tpu import paged_attention as pa  # pylint: disable=import-outside-toplevel
  _, per_call = tpu_row_calls(*table_BxP.shape)
  outs = [pa.paged_attention(q_BxHxK[i:i + per_call], k_pages, v_pages, lengths_B[i:i + per_call],
                             table_BxP[i:i + per_call],
                             pages_per_compute_block=spec.pages_per_block)
          for i in range(0, q_BxHxK.shape[0], per_call)]
  return outs[0] if len(outs) == 1 else jnp.concatenate(outs)


def _gpu_kernel(q_BxHxK, k_pages, v_pages, lengths_B, table_BxP, spec):
  """jax's Pallas GPU kernel; off a GPU in Pallas' interpret mode (tests on CPU)."""
  from jax.experimental.pallas.ops.gpu import paged_attention as pg  # pylint: disable=import-outside-toplevel
  return pg.paged_attention(q_BxHxK, k_pages, v_pages, table_BxP, lengths_B,
                            block_h=GPU_BLOCK_H, pages_per_compute_block=spec.pages_per_block,
                            k_splits=spec.gpu_splits,
                            interpret=attention_shard.platform(spec.mesh) != "gpu")


def attend_kernel(q_Bx1xHxK, k_pages, v_pages, table_BxP, positions_B, layer, spec):
  """The platform's Pallas paged-attention kernel over the rows' pages (see the module doc)."""
  if spec.kernel == "tpu":
    attention_shard.check_tpu_interpretable(spec.mesh, "paged attention (TPU kernel)")
  kernel = _gpu_kernel if spec.kernel == "gpu" else _tpu_kernel
  b, _, h, hd = q_Bx1xHxK.shape
  stacked = layer is not None
  batch, heads, pool = _kernel_specs(spec, h, k_pages.shape[0], stacked)
  layer = jnp.int32(0) if layer is None else layer
  q = (q_Bx1xHxK[:, 0].astype(jnp.float32) * (1.0 / math.sqrt(hd))).astype(k_pages.dtype)

  def local(q, kp, vp, table, lengths, lay):
    if stacked:  # fold the layer into the page axis: a view, not a copy
      kv, nl, npg, ps, d = kp.shape
      kp, vp = kp.reshape(kv, nl * npg, ps, d), vp.reshape(kv, nl * npg, ps, d)
    else:
      npg = kp.shape[1]
    shard = jax.lax.axis_index(batch) if batch else 0
    idx = table - shard * npg + lay * npg  # global page ids -> this shard's (layer's) pages
    return kernel(q, kp, vp, lengths, idx, spec)

  o = jax.shard_map(local, mesh=spec.mesh,
                    in_specs=(P(batch, heads, None), pool, pool, P(batch, None), P(batch), P()),
                    out_specs=P(batch, heads, None), check_vma=False)(
                        q, k_pages, v_pages, table_BxP, positions_B + 1, layer)
  return o.reshape(b, 1, h, hd).astype(q_Bx1xHxK.dtype)


def write(pages, layer, page_B, off_B, x_BxKvxHd):
  """Stores each row's new K (or V) at (page, offset), of `layer` of a stacked pool if set.
  Every (KV head, row) is its own scatter index, so the update window is only Hd: the pool
  keeps its row-major layout (the kernel's) instead of XLA:TPU re-laying it out, and copying
  it back, around a scatter whose window spans the KV heads."""
  x = x_BxKvxHd.swapaxes(0, 1).astype(pages.dtype)  # [Kv, B, Hd]
  kv_Kx1 = jnp.arange(pages.shape[0])[:, None]
  if layer is None:
    return pages.at[kv_Kx1, page_B[None, :], off_B[None, :]].set(x)
  return pages.at[kv_Kx1, layer, page_B[None, :], off_B[None, :]].set(x)


def decode_step(model, tokens_B, positions_B, pool, table_BxP, spec: PagedSpec, *,
                layer_params=None):
  """`decode_step_routed` without the routing: (logits [B, V], pool)."""
  return decode_step_routed(model, tokens_B, positions_B, pool, table_BxP, spec,
                            layer_params=layer_params)[:2]


def decode_step_routed(model, tokens_B, positions_B, pool, table_BxP, spec: PagedSpec, *,
                       layer_params=None):
  """(logits, pool, each MoE layer's experts for the tokens [Lm, B, K] int32 or None for a
  dense model): `Qwen2.decode_step` over a paged pool: one token per row, written at its position's
  page, attending to its pages up to that position. The pool's form picks the layer loop
  (stacked [Kv, L, N, page, Hd]: scanned, in place; per-layer lists from `split_pages`:
  unrolled, with `layer_params` taken once outside the loop) and is returned in that form."""
  cfg = model.cfg
  rows = jnp.arange(tokens_B.shape[0])
  page_B = table_BxP[rows, positions_B // spec.page_size]
  off_B = positions_B % spec.page_size
  fn = attend_kernel if spec.kernel else attend_reference

  def attend(q, kp, vp, layer):
    return fn(q, kp, vp, table_BxP, positions_B, layer, spec)

  def store(pages, layer, x_BxKvxHd):
    return write(pages, layer, page_B, off_B, x_BxKvxHd)

  cos, sin = L.rope_cos_sin(positions_B[:, None], L.rope_inv_freq(cfg))
  h = jnp.take(model.embed.get_value(), tokens_B[:, None], axis=0).astype(model.dtype)
  if isinstance(pool["k"], (list, tuple)):
    h, pool, ids = _unrolled(cfg, layer_params or model.layer_params(), h, cos, sin, pool,
                             attend, store)
  else:
    h, pool, ids = _scanned(cfg, model.layers.arrays(), h, cos, sin, pool, attend, store)
  h = L.rms_norm(h[:, 0], model.final_norm.get_value(), eps=cfg.rms_norm_eps)
  return model.logits(h), pool, (None if ids is None else ids[:, :, 0])


def _unrolled(cfg, layer_params, h, cos, sin, pool, attend, store):
  ks, vs, ids = list(pool["k"]), list(pool["v"]), []
  for i, p in enumerate(layer_params):
    def attention(q, k, v, i=i):
      ks[i], vs[i] = store(ks[i], None, k[:, 0]), store(vs[i], None, v[:, 0])
      return attend(q, ks[i], vs[i], None), None
    h, _, routing = L.decoder_layer_routed(cfg, p, h, cos, sin, attention)
    if routing is not None:
      ids.append(routing.ids)
  return h, {"k": tuple(ks), "v": tuple(vs)}, (jnp.stack(ids) if ids else None)


def _scanned(cfg, stacked_params, h, cos, sin, pool, attend, store):
  def layer_step(carry, p):
    h, layer, kp, vp = carry
    new = {}

    def attention(q, k, v):
      new["k"], new["v"] = store(kp, layer, k[:, 0]), store(vp, layer, v[:, 0])
      return attend(q, new["k"], new["v"], layer), None
    h, _, routing = L.decoder_layer_routed(cfg, p, h, cos, sin, attention)
    return (h, layer + 1, new["k"], new["v"]), (None if routing is None else routing.ids)

  init = (h, jnp.int32(0), pool["k"], pool["v"])
  (h, _, kp, vp), ids = jax.lax.scan(layer_step, init, stacked_params)
  return h, {"k": kp, "v": vp}, ids
