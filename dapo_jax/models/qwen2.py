"""Qwen2-family decoder in Flax NNX (also Llama-3 and Qwen3 configs), with a KV-cache path.

Layer parameters are stacked on a leading `layers` axis and the layers run under
`jax.lax.scan`, so compile time does not grow with depth. Every parameter carries its logical
axis names in the `logical_axes` metadata; `dapo_jax.sharding` maps them to mesh axes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models import attention as attention_lib
from dapo_jax.models import decode as decode_lib
from dapo_jax.models import layers as L
from dapo_jax.models.config import ModelConfig

__all__ = ["ModelConfig", "Qwen2", "token_logprobs", "default_positions"]

# Logical axes of each KV-cache array [L, B, S, Kv, Hd].


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, std=0.02):
  """N(0, std^2) from an RngBitGenerator stream keyed by `key`.

  XLA:CPU compiles threefry sampling ~10x slower than RngBitGenerator (seconds per distinct
  shape), and init needs no cross-version bit stability. The stream is sharding-invariant.
  """
  kd = jax.random.key_data(key).ravel().astype(jnp.uint32)
  kd = jnp.resize(jnp.concatenate([kd, kd ^ jnp.uint32(0x9E3779B9)]), (4,))
  return std * jax.random.normal(jax.random.wrap_key_data(kd, impl="rbg"), shape, jnp.float32)


def _param(rngs, shape, axes, dtype, init="normal"):
  if init == "normal":
    value = _normal(rngs.params(), shape)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), logical_axes=axes)


class Layers(nnx.Module):
  """All decoder layers' weights, stacked on a leading [L] axis."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    n, d, f = cfg.num_layers, cfg.hidden_size, cfg.intermediate_size
    h, kv, k = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = functools.partial(_param, rngs, dtype=jnp.dtype(cfg.param_dtype))
    self.attn_norm = p((n, d), ("layers", "norm"), init="ones")
    self.wq = p((n, d, h, k), ("layers", "embed", "heads", "head_dim"))
    self.wk = p((n, d, kv, k), ("layers", "embed", "kv_heads", "head_dim"))
    self.wv = p((n, d, kv, k), ("layers", "embed", "kv_heads", "head_dim"))
    self.wo = p((n, h, k, d), ("layers", "heads", "head_dim", "embed"))
    if cfg.attention_bias:
      self.bq = p((n, h, k), ("layers", "heads", "head_dim"), init="zeros")
      self.bk = p((n, kv, k), ("layers", "kv_heads", "head_dim"), init="zeros")
      self.bv = p((n, kv, k), ("layers", "kv_heads", "head_dim"), init="zeros")
    if cfg.qk_norm:
      self.q_norm = p((n, k), ("layers", "norm"), init="ones")
      self.k_norm = p((n, k), ("layers", "norm"), init="ones")
    self.mlp_norm = p((n, d), ("layers", "norm"), init="ones")
    self.w_gate = p((n, d, f), ("layers", "embed", "mlp"))
    self.w_up = p((n, d, f), ("layers", "embed", "mlp"))
    self.w_down = p((n, f, d), ("layers", "mlp", "embed"))

  def arrays(self) -> dict:
    """The stacked weights as a dict of arrays (the `xs` of the layer scan)."""
    return {name: v.get_value() for name, v in vars(self).items()
            if isinstance(v, nnx.Param)}


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
    self.embed = _param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), pdt)
    self.layers = Layers(cfg, rngs=rngs)
    self.final_norm = _param(rngs, (cfg.hidden_size,), ("norm",), pdt, init="ones")
    if not cfg.tie_word_embeddings:
      self.lm_head = _param(rngs, (cfg.hidden_size, cfg.vocab_size), ("embed", "vocab"), pdt)

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

  def _embed(self, tokens):
    return jnp.take(self.embed.get_value(), tokens, axis=0).astype(self.dtype)

  def _run_layers(self, h, cos, sin, attention, remat=False):
    """Every layer, under lax.scan or unrolled (cfg.scan_layers); returns (h, stacked aux).

    Scan keeps compile time flat in depth; unrolled avoids the scan's per-layer weight
    slices and, in the backward pass, its stacked gradient / residual updates.
    """
    def body(h, p):
      return L.decoder_layer(self.cfg, p, h, cos, sin, attention)

    if remat:
      body = jax.checkpoint(body, prevent_cse=False,
                            policy=jax.checkpoint_policies.nothing_saveable)
    if self.cfg.scan_layers:
      return jax.lax.scan(body, h, self.layers.arrays())
    auxes = []
    for p in self.layer_params():
      h, aux = body(h, p)
      auxes.append(aux)
    return h, jax.tree.map(lambda *xs: jnp.stack(xs), *auxes)

  # ----- full sequence --------------------------------------------------------------------
  def _full(self, tokens_BxT, mask_BxT, positions_BxT, *, collect_kv: bool,
            segment_ids_BxT=None, mesh=None):
    """Hidden states (and each layer's K/V when collect_kv: prefill, on the plain path).

    Query t sees key s <= t of its own segment (`segment_ids_BxT`: packed rows, 0 = padding),
    or without segments every real key (mask_BxT) s <= t."""
    _check_bt("tokens_BxT", tokens_BxT)
    for name, x in (("mask_BxT", mask_BxT), ("positions_BxT", positions_BxT),
                    ("segment_ids_BxT", segment_ids_BxT)):
      if x is not None and x.shape != tokens_BxT.shape:
        raise ValueError(f"{name} shape {x.shape} != tokens_BxT shape {tokens_BxT.shape}")
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

    h = self._embed(tokens_BxT)
    h, kv = self._run_layers(h, cos, sin, attention, remat=self.cfg.remat)
    h = L.rms_norm(h, self.final_norm.get_value(), eps=self.cfg.rms_norm_eps)
    return h, kv

  def hidden(self, tokens_BxT, mask_BxT, positions_BxT=None, *, segment_ids_BxT=None,
             mesh=None):
    """Final-norm hidden states [B, T, D] (compute dtype); segments: see `_full`."""
    return self._full(tokens_BxT, mask_BxT, positions_BxT, collect_kv=False,
                      segment_ids_BxT=segment_ids_BxT, mesh=mesh)[0]

  def __call__(self, tokens_BxT, mask_BxT, positions_BxT=None):
    """Full-sequence logits [B, T, V] in float32."""
    return self.logits(self.hidden(tokens_BxT, mask_BxT, positions_BxT))

  # ----- KV cache -------------------------------------------------------------------------
  def init_cache(self, batch: int, max_len: int) -> dict:
    """Zero KV cache {"k", "v"}: [L, B, S, Kv, Hd] each, in the compute dtype."""
    if batch <= 0 or max_len <= 0:
      raise ValueError(f"init_cache needs batch > 0 and max_len > 0, got {batch}, {max_len}")
    c = self.cfg
    shape = (c.num_layers, batch, max_len, c.num_kv_heads, c.head_dim)
    return {"k": jnp.zeros(shape, self.dtype), "v": jnp.zeros(shape, self.dtype)}

  def prefill(self, tokens_BxT, lengths_B, *, cache_len: int | None = None):
    """Right-padded prompts -> (logits at position len-1 [B, V], cache with S = cache_len or T).

    Positions are 0..len-1. Cache entries past a row's length hold junk that decode_step
    overwrites before it can be read.
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
    h, (k, v) = self._full(tokens_BxT, mask, positions, collect_kv=True)
    last = jnp.clip(lengths_B - 1, 0, t - 1)
    h_last = jnp.take_along_axis(h, last[:, None, None], axis=1)[:, 0]
    if cache_len is not None and cache_len > t:
      pad = ((0, 0), (0, 0), (0, cache_len - t), (0, 0), (0, 0))
      k, v = jnp.pad(k, pad), jnp.pad(v, pad)
    return self.logits(h_last), {"k": k, "v": v}

  def layer_params(self) -> list[dict]:
    """Each layer's weights as arrays of their own (static slices of the stacked weights).

    XLA:CPU materialises every slice of a stacked weight, so a decode loop takes these once,
    outside the loop, instead of slicing (copying) all weights at every step.
    """
    w = self.layers.arrays()
    return [{name: a[i] for name, a in w.items()} for i in range(self.cfg.num_layers)]

  def decode_step(self, tokens_B, positions_B, cache, *, layer_params=None):
    """One token per slot: writes its K/V at `positions_B`, attends to keys j <= position.

    Rows may be at different positions. Positions must be < the cache length S. The cache's
    form picks the layer loop, and the result has the same form:
    - stacked {"k", "v"} [L, B, S, Kv, Hd]: lax.scan over layers, the cache updated in place
      (the form for accelerators and big models: one cache buffer, no per-layer copies);
    - per layer (`split_cache`): layers unrolled, each updating only its own buffer (what
      the CPU decode loop carries; `layer_params`: `layer_params()` taken once outside it).
    Attention reads only the first `n` cache positions, n the smallest bucket
    (`decode_buckets`) holding every row's position, chosen at run time.
    """
    _check_bt("tokens_B", tokens_B, ndim=1)
    b = tokens_B.shape[0]
    if positions_B.shape != (b,):
      raise ValueError(f"positions_B shape {positions_B.shape} != ({b},)")
    if set(cache) != {"k", "v"} or len(cache["k"]) != self.cfg.num_layers or (
        cache["k"][0].shape[0] != b):
      raise ValueError(f"cache must be {{'k', 'v'}} with {self.cfg.num_layers} layers and "
                       f"batch {b}, got {jax.tree.map(jnp.shape, cache)}")
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
    if stacked:
      h, cache = decode_lib.scanned(self.cfg, self.layers.arrays(), h, cos, sin, cache, at)
    else:
      h, cache = decode_lib.unrolled(self.cfg, layer_params or self.layer_params(), h, cos,
                                     sin, cache, at)
    h = L.rms_norm(h[:, 0], self.final_norm.get_value(), eps=self.cfg.rms_norm_eps)
    return self.logits(h), cache


def split_cache(cache) -> tuple[list, list]:
  """Stacked {"k", "v"} [L, B, S, Kv, Hd] -> (keys, values): lists of L [B, S, Kv, Hd]."""
  n = cache["k"].shape[0]
  return [cache["k"][i] for i in range(n)], [cache["v"][i] for i in range(n)]


def stack_cache(ks, vs) -> dict:
  """Inverse of `split_cache`."""
  return {"k": jnp.stack(ks), "v": jnp.stack(vs)}


def _check_logprob_args(model, tokens_BxT, mask_BxT, temperature, chunk_size) -> int:
  """token_logprobs' argument checks; returns the chunk size to use."""
  _check_bt("tokens_BxT", tokens_BxT)
  if mask_BxT.shape != tokens_BxT.shape:
    raise ValueError(f"mask_BxT shape {mask_BxT.shape} != tokens_BxT shape {tokens_BxT.shape}")
  if isinstance(temperature, (int, float)) and not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")
  chunk_size = model.cfg.logits_chunk if chunk_size is None else chunk_size
  if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
    raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
  return chunk_size


def token_logprobs(model: Qwen2, tokens_BxT, mask_BxT, *, temperature: float = 1.0,
                   chunk_size: int | None = None, with_entropy: bool = True,
                   positions_BxT=None, segment_ids_BxT=None, mesh=None):
  """Log-probs (and entropies) of the given tokens, in chunks of the flattened sequence.

  logp[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]], logp[:, 0] = 0;
  entropy[:, t] is the entropy of that distribution; both are 0 where mask_BxT is 0.
  A chunk covers about `chunk_size` tokens (max(1, chunk_size // B) positions of every row,
  so batch sharding is kept), each chunk's logits are rematerialised in the backward pass:
  at most one [B, chunk, V] float32 block lives at a time. Returns (logp, entropy or None).
  Packed rows (`train/packing.py`) pass their per-segment positions and segment ids; the first
  token of each segment then gets a junk value (it follows another segment), which its mask
  hides: it is a prompt token. `mesh`: for the training attention (`Qwen2._full`).
  """
  chunk_size = _check_logprob_args(model, tokens_BxT, mask_BxT, temperature, chunk_size)
  b, t = tokens_BxT.shape
  zeros = jnp.zeros((b, t), jnp.float32)
  if t == 1:
    return zeros, (zeros if with_entropy else None)
  h_BxTxD = model.hidden(tokens_BxT, mask_BxT, positions_BxT, segment_ids_BxT=segment_ids_BxT,
                         mesh=mesh)
  w_DxV = model.output_weight()
  c = max(1, chunk_size // b)
  n = -(-(t - 1) // c)
  pad = n * c - (t - 1)
  h_prev = jnp.pad(h_BxTxD[:, :-1], ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, pad)))
  h_n = h_prev.reshape(b, n, c, -1).swapaxes(0, 1)
  y_n = targets.reshape(b, n, c).swapaxes(0, 1)

  @jax.checkpoint
  def chunk(h_BxCxD, y_BxC):
    z = L.dense(h_BxCxD, w_DxV, out_dtype=jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, y_BxC[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
      return logp, None
    p = jnp.exp(z - lse[..., None])
    return logp, lse - jnp.sum(p * z, axis=-1)

  _, (logp_n, ent_n) = jax.lax.scan(lambda _, xs: (None, chunk(*xs)), None, (h_n, y_n))

  def unchunk(x_n):
    x = x_n.swapaxes(0, 1).reshape(b, n * c)[:, : t - 1]
    x = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), x], axis=1)
    return jnp.where(mask_BxT > 0, x, 0.0)

  return unchunk(logp_n), (unchunk(ent_n) if with_entropy else None)
