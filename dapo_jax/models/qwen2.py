"""Qwen2-family decoder in Flax NNX (also Llama-3, Qwen3 and Qwen3-MoE configs), with a
KV-cache path.

Layer parameters are stacked on a leading `layers` axis (`weights.Layers`) and the layers run
under `jax.lax.scan`, so compile time does not grow with depth.

Routing replay (Qwen3-MoE, `models/moe.py`): the `*_routed` passes also return the experts
every token was routed to, per MoE layer (`ModelConfig.moe_layers`, in order), and every pass
takes such ids to route by instead (`expert_ids_*`; ids < 0 = route that token by its own
router); the gate weights still come from this model's router.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax import sharding
from dapo_jax.models import attention as attention_lib
from dapo_jax.models import decode as decode_lib
from dapo_jax.models import layer_loop
from dapo_jax.models import layers as L
from dapo_jax.models import moe
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.logprobs import routed_token_logprobs, token_logprobs
from dapo_jax.models.weights import Layers, param

__all__ = ["ModelConfig", "Qwen2", "token_logprobs", "routed_token_logprobs",
           "default_positions"]


def default_positions(mask_BxT):
  """Position of each token among the real tokens of its row: clip(cumsum(mask) - 1, 0)."""
  return jnp.maximum(jnp.cumsum(mask_BxT.astype(jnp.int32), axis=1) - 1, 0)


def _check_bt(name, x, ndim=2):
  if x.ndim != ndim:
    raise ValueError(f"{name} must have rank {ndim}, got shape {x.shape}")


class Qwen2(nnx.Module):
  """Decoder-only transformer: embeddings, stacked layers, final norm, (tied) LM head."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    pdt = jnp.dtype(cfg.param_dtype)
    self.embed = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pdt)
    self.layers = Layers(cfg, rngs=rngs)
    self.final_norm = param(rngs, (cfg.hidden_size,), ("norm",), pdt, init="ones")
    if not cfg.tie_word_embeddings:
      self.lm_head = param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pdt)

  # ----- pieces ---------------------------------------------------------------------------
  @property
  def dtype(self):
    return jnp.dtype(self.cfg.dtype)

  def output_weight(self):
    """The LM head as [D, V] (the transposed embedding when tied)."""
    if self.cfg.tie_word_embeddings:
      return self.embed.get_value().T
    return self.lm_head.get_value()

  def logits(self, h_xD):
    """LM-head logits in float32 for hidden states of any leading shape."""
    return L.dense(h_xD, self.output_weight(), out_dtype=jnp.float32)

  def _embed(self, tokens, mesh=None):
    """Embeddings of `tokens`; with context parallelism the table's rows are taken whole (its
    embed dimension gathered first, as FSDP does for every weight), so the result can split
    over the tokens without a reshuffle."""
    table = sharding.constrain_tokens(self.embed.get_value(), mesh, names=("vocab", None))
    return jnp.take(table, tokens, axis=0).astype(self.dtype)

  # ----- full sequence --------------------------------------------------------------------
  def _full(self, tokens_BxT, mask_BxT, positions_BxT, *, collect_kv: bool,
            segment_ids_BxT=None, mesh=None, expert_ids_LxBxTxK=None):
    """(hidden states, each layer's K/V when collect_kv (prefill, plain path) else None,
    moe.Routing or None).

    Query t sees key s <= t of its own segment (`segment_ids_BxT`: packed rows, 0 = padding),
    or without segments every real key (mask_BxT) s <= t."""
    _check_bt("tokens_BxT", tokens_BxT)
    for name, x in (("mask_BxT", mask_BxT), ("positions_BxT", positions_BxT),
                    ("segment_ids_BxT", segment_ids_BxT)):
      if x is not None and x.shape != tokens_BxT.shape:
        raise ValueError(f"{name} shape {x.shape} != tokens_BxT shape {tokens_BxT.shape}")
    layer_loop.check_replay(self.cfg, expert_ids_LxBxTxK, tokens_BxT.shape,
                            "expert_ids_LxBxTxK")
    if positions_BxT is None:
      positions_BxT = default_positions(mask_BxT)
    if segment_ids_BxT is None:
      q_seg, kv_seg = jnp.ones(mask_BxT.shape, jnp.int32), (mask_BxT > 0).astype(jnp.int32)
    else:
      q_seg = kv_seg = segment_ids_BxT.astype(jnp.int32)
    cos, sin = L.rope_cos_sin(positions_BxT, L.rope_inv_freq(self.cfg))
    impl = "plain" if collect_kv else self.cfg.attention_impl

    def attention(q, k, v):
      o = attention_lib.attend(q, k, v, q_seg, kv_seg, impl=impl,
                               block=self.cfg.attention_chunk, mesh=mesh)
      return o, ((k, v) if collect_kv else None)

    h = sharding.constrain_tokens(self._embed(tokens_BxT, mesh), mesh)
    h, kv, routing = layer_loop.run(self.cfg, self.layers, h, cos, sin, attention,
                                    valid_BxT=kv_seg > 0, replay_LxBxTxK=expert_ids_LxBxTxK,
                                    mesh=mesh)
    h = L.rms_norm(h, self.final_norm.get_value(), eps=self.cfg.rms_norm_eps)
    return h, kv, layer_loop.routing_of(self.cfg, routing, kv_seg > 0)

  def hidden_routed(self, tokens_BxT, mask_BxT, positions_BxT=None, *, segment_ids_BxT=None,
                    mesh=None, expert_ids_LxBxTxK=None) -> tuple[jax.Array, moe.Routing | None]:
    """(final-norm hidden states [B, T, D] in the compute dtype, moe.Routing or None for a
    dense model); segments: see `_full`; expert_ids_LxBxTxK: routing replay (module doc)."""
    h, _, routing = self._full(tokens_BxT, mask_BxT, positions_BxT, collect_kv=False,
                               segment_ids_BxT=segment_ids_BxT, mesh=mesh,
                               expert_ids_LxBxTxK=expert_ids_LxBxTxK)
    return h, routing

  def hidden(self, tokens_BxT, mask_BxT, positions_BxT=None, *, segment_ids_BxT=None,
             mesh=None, expert_ids_LxBxTxK=None):
    """Final-norm hidden states [B, T, D] (compute dtype); see `hidden_routed`."""
    return self.hidden_routed(tokens_BxT, mask_BxT, positions_BxT,
                              segment_ids_BxT=segment_ids_BxT, mesh=mesh,
                              expert_ids_LxBxTxK=expert_ids_LxBxTxK)[0]

  def __call__(self, tokens_BxT, mask_BxT, positions_BxT=None, *, expert_ids_LxBxTxK=None):
    """Full-sequence logits [B, T, V] in float32."""
    return self.logits(self.hidden(tokens_BxT, mask_BxT, positions_BxT,
                                   expert_ids_LxBxTxK=expert_ids_LxBxTxK))

  # ----- KV cache -------------------------------------------------------------------------
  def init_cache(self, batch: int, max_len: int) -> dict:
    """Zero KV cache {"k", "v"}: [L, B, S, Kv, Hd] each, in the compute dtype."""
    if batch <= 0 or max_len <= 0:
      raise ValueError(f"init_cache needs batch > 0 and max_len > 0, got {batch}, {max_len}")
    c = self.cfg
    shape = (c.num_layers, batch, max_len, c.num_kv_heads, c.head_dim)
    return {"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype)}

  def prefill_routed(self, tokens_BxT, lengths_B, *, cache_len: int | None = None,
                     expert_ids_LxBxTxK=None):
    """Right-padded prompts -> (logits at position len-1 [B, V], cache with S = cache_len or
    T, each token's experts [Lm, B, T, K] int32 or None for a dense model).

    Positions are 0..len-1. Cache entries past a row's length hold junk that decode_step
    overwrites before it can be read. expert_ids_LxBxTxK: routing replay (module doc).
    """
    _check_bt("tokens_BxT", tokens_BxT)
    _check_bt("lengths_B", lengths_B, ndim=1)
    b, t = tokens_BxT.shape
    if lengths_B.shape != (b,):
      raise ValueError(f"lengths_B shape {lengths_B.shape} != ({b},)")
    if cache_len is not None and cache_len < t:
      raise ValueError(f"prefill cache_len={cache_len} is shorter than the prompts ({t})")
    mask = jnp.arange(t)[None, :] < lengths_B[:, None]
    positions = jnp.broadcast_to(jnp.arange(t)[None, :], (b, t))
    h, (k, v), routing = self._full(tokens_BxT, mask, positions, collect_kv=True,
                                    expert_ids_LxBxTxK=expert_ids_LxBxTxK)
    last = jnp.clip(lengths_B - 1, 0, t - 1)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    if cache_len is not None and cache_len > t:
      pad = ((0, 0), (0, 0), (0, cache_len - t), (0, 0), (0, 0))
      k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    ids = None if routing is None else routing.expert_ids_LxBxTxK
    return self.logits(h_last), {"k": k, "v": v}, ids

  def prefill(self, tokens_BxT, lengths_B, *, cache_len: int | None = None,
              expert_ids_LxBxTxK=None):
    """`prefill_routed` without the routing: (logits [B, V], cache)."""
    return self.prefill_routed(tokens_BxT, lengths_B, cache_len=cache_len,
                               expert_ids_LxBxTxK=expert_ids_LxBxTxK)[:2]

  def layer_params(self) -> list[dict]:
    """Each layer's weights as arrays of their own (static slices of the stacked weights).

    XLA:CPU materialises every slice of a stacked weight, so a decode loop takes these once,
    outside the loop, instead of slicing (copying) all weights at every step.
    """
    return self.layers.layer_params()

  def decode_step_routed(self, tokens_B, positions_B, cache, *, layer_params=None,
                         expert_ids_LxBxK=None):
    """One token per slot -> (logits [B, V], cache, its experts [Lm, B, K] or None): writes
    its K/V at `positions_B`, attends to keys j <= position.

    Rows may be at different positions. Positions must be < the cache length S. The cache's
    form picks the layer loop, and the result has the same form:
    - stacked {"k", "v"} [L, B, S, Kv, Hd]: lax.scan over layers, the cache updated in place
      (the form for accelerators and big models: one cache buffer, no per-layer copies);
    - per layer (`split_cache`): layers unrolled, each updating only its own buffer (what
      the CPU decode loop carries; `layer_params`: `layer_params()` taken once outside it).
    Attention reads only the first `n` cache positions, n the smallest bucket
    (`decode_buckets`) holding every row's position, chosen at run time.
    expert_ids_LxBxK: routing replay (module doc).
    """
    b = _check_decode_args(self.cfg, tokens_B, positions_B, cache, expert_ids_LxBxK)
    stacked = not isinstance(cache["k"], (list, tuple))
    s = cache["k"][0].shape[-3]
    sizes = L.decode_buckets(s)
    bucket = jnp.minimum(jnp.searchsorted(jnp.asarray(sizes), jnp.max(positions_B) + 1),
                         len(sizes) - 1)
    allowed_BxS = jnp.arange(s)[None, :] <= positions_B[:, None]
    at = decode_lib.DecodeAt(rows=jnp.arange(b), positions_B=positions_B, bucket=bucket,
                             sizes=sizes, allowed_BxS=allowed_BxS)
    cos, sin = L.rope_cos_sin(positions_B[:, None], L.rope_inv_freq(self.cfg))
    h = self._embed(tokens_B[:, None])
    replay = None if expert_ids_LxBxK is None else expert_ids_LxBxK[:, :, None]
    if stacked and not self.cfg.mixed_layers:
      h, cache, ids = decode_lib.scanned(self.cfg, self.layers.arrays(), h, cos, sin, cache,
                                         at, replay)
    else:  # a stacked cache of a mixed model is run per layer and stacked again
      per_layer = dict(zip(("k", "v"), split_cache(cache))) if stacked else cache
      h, cache, ids = decode_lib.unrolled(self.cfg, layer_params or self.layer_params(), h,
                                          cos, sin, per_layer, at, replay)
      cache = stack_cache(cache["k"], cache["v"]) if stacked else cache
    h = L.rms_norm(h[:, 0], self.final_norm.get_value(), eps=self.cfg.rms_norm_eps)
    return self.logits(h), cache, (None if ids is None else ids[:, :, 0])

  def decode_step(self, tokens_B, positions_B, cache, *, layer_params=None,
                  expert_ids_LxBxK=None):
    """`decode_step_routed` without the routing: (logits [B, V], cache)."""
    return self.decode_step_routed(tokens_B, positions_B, cache, layer_params=layer_params,
                                   expert_ids_LxBxK=expert_ids_LxBxK)[:2]


def _check_decode_args(cfg, tokens_B, positions_B, cache, expert_ids_LxBxK) -> int:
  """decode_step's argument checks; returns the batch size."""
  _check_bt("tokens_B", tokens_B, ndim=1)
  b = tokens_B.shape[0]
  if positions_B.shape != (b,):
    raise ValueError(f"positions_B shape {positions_B.shape} != ({b},)")
  if set(cache) != {"k", "v"} or len(cache["k"]) != cfg.num_layers or (
      cache["k"][0].shape[0] != b):
    raise ValueError(f"cache must be {{'k', 'v'}} with {cfg.num_layers} layers and "
                     f"batch {b}, got {jax.tree.map(jnp.shape, cache)}")
  layer_loop.check_replay(cfg, expert_ids_LxBxK, (b,), "expert_ids_LxBxK")
  return b


def split_cache(cache) -> tuple[list, list]:
  """Stacked {"k", "v"} [L, B, S, Kv, Hd] -> (keys, values): lists of L [B, S, Kv, Hd]."""
  n = cache["k"].shape[0]
  return [cache["k"][i] for i in range(n)], [cache["v"][i] for i in range(n)]


def stack_cache(ks, vs) -> dict:
  """Inverse of `split_cache`."""
  return {"k": jnp.stack(ks), "v": jnp.stack(vs)}
