"""Pure building blocks of the decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.models import lora, moe, quant
from dapo_jax.models.config import ModelConfig

# Finite, so a query row with no visible key (left padding) gives a uniform junk row, not NaN.
_MASKED = -1e30


def rms_norm(x, weight, *, eps: float):
  """HF-order RMSNorm: normalise in float32, cast back, then scale."""
  x32 = x.astype(jnp.float32)
  var = jnp.mean(jnp.square(x32), axis=-1, keepdims=True)
  y = (x32 * jax.lax.rsqrt(var + eps)).astype(x.dtype)
  return weight.astype(x.dtype).reshape((1,) * (x.ndim - 1) + (-1,)) * y


def rope_inv_freq(cfg: ModelConfig) -> np.ndarray:
  """Inverse frequencies [head_dim / 2] (float32), with Llama-3 scaling when configured."""
  dim = cfg.head_dim
  exponent = np.arange(0, dim, 2, dtype=np.float32) / np.float32(dim)
  inv_freq = (1.0 / (np.float32(cfg.rope_theta) ** exponent)).astype(np.float32)
  s = cfg.rope_scaling
  if s is None:
    return inv_freq
  # Llama 3.1: long wavelengths divided by `factor`, a smooth ramp between the two bands.
  factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
  old_len = s["original_max_position_embeddings"]
  wavelen = (2 * math.pi / inv_freq).astype(np.float32)
  scaled = np.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
  smooth = (old_len / wavelen - low) / (high - low)
  smoothed = (1 - smooth) * scaled / factor + smooth * scaled
  medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
  return np.where(medium, smoothed, scaled).astype(np.float32)


def rope_cos_sin(positions, inv_freq):
  """cos, sin of shape positions.shape + [head_dim], float32 (HF's cat(freqs, freqs) layout)."""
  pos = positions.astype(jnp.float32)
  freqs = pos[..., None] * jnp.asarray(inv_freq).reshape((1,) * pos.ndim + (-1,))
  emb = jnp.concatenate([freqs, freqs], axis=-1)
  return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x_BxTxHxK, cos_BxTxK, sin_BxTxK):
  """Rotates the halves of the head dimension (non-interleaved, as HF Qwen2/Llama)."""
  half = x_BxTxHxK.shape[-1] // 2
  x = x_BxTxHxK.astype(jnp.float32)
  rot = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
  cos, sin = cos_BxTxK[:, :, None, :], sin_BxTxK[:, :, None, :]
  return (x * cos + rot * sin).astype(x_BxTxHxK.dtype)


def attend(q_BxTxHxK, k_BxSxKvxK, v_BxSxKvxK, allowed_BxTxS):
  """Grouped-query softmax attention; scores and softmax in float32."""
  b, t, h, k = q_BxTxHxK.shape
  kv = k_BxSxKvxK.shape[2]
  q = q_BxTxHxK.reshape(b, t, kv, h // kv, k)
  s = jnp.einsum("btngk,bsnk->bngts", q, k_BxSxKvxK, preferred_element_type=jnp.float32)
  s = s * (1.0 / math.sqrt(k))
  s = jnp.where(allowed_BxTxS[:, None, None, :, :], s, _MASKED)
  p = jax.nn.softmax(s, axis=-1).astype(v_BxSxKvxK.dtype)
  o = jnp.einsum("bngts,bsnk->btngk", p, v_BxSxKvxK, preferred_element_type=jnp.float32)
  return o.reshape(b, t, h, k).astype(q_BxTxHxK.dtype)


def attend_one(q_Bx1xHxK, k_BxSxKvxK, v_BxSxKvxK, allowed_BxS):
  """`attend` for one query per row, reading the cache once in its stored layout.

  Decode is memory-bound. A grouped dot_general would first transpose the [B, S, Kv, K]
  cache to put (B, Kv) leading; instead every query head is scored against every KV head
  with plain batched matmuls over the flattened (S, Kv) axis, and the off-group blocks are
  masked out. That wastes Kv x of tiny flops to save a full copy of the cache per layer.
  """
  b, _, h, k = q_Bx1xHxK.shape
  s, kv = k_BxSxKvxK.shape[1], k_BxSxKvxK.shape[2]
  dt = k_BxSxKvxK.dtype
  q = q_Bx1xHxK.reshape(b, h, k).astype(dt)
  keys = k_BxSxKvxK.reshape(b, s * kv, k)
  # [B, M, H] output order: XLA:CPU runs this form several times faster than [B, H, M].
  scores = jnp.einsum("bmk,bhk->bmh", keys, q, preferred_element_type=jnp.float32)
  # own_KvxH[n, h]: query head h belongs to KV group n (heads are grouped contiguously).
  own_KvxH = jnp.arange(kv)[:, None] == (jnp.arange(h)[None, :] // (h // kv))
  visible = allowed_BxS[:, :, None, None] & own_KvxH[None, None]  # [B, S, Kv, H]
  scores = jnp.where(visible, scores.reshape(b, s, kv, h) * (1.0 / math.sqrt(k)), _MASKED)
  p = jax.nn.softmax(scores.reshape(b, s * kv, h), axis=1)
  o = jnp.einsum("bmh,bmk->bhk", p.astype(dt), v_BxSxKvxK.reshape(b, s * kv, k),
                 preferred_element_type=jnp.float32)
  return o.reshape(b, 1, h, k).astype(q_Bx1xHxK.dtype)


# The decode step reads the cache up to the smallest of these lengths that holds the live
# context (a run-time choice between compiled branches), so its cost follows the context.
DECODE_BLOCK = 64


def decode_buckets(s: int) -> tuple[int, ...]:
  """Cache prefix lengths the decode step may read: 64, 128, 256, ... below S, then S."""
  sizes, n = [], DECODE_BLOCK
  while n < s:
    sizes.append(n)
    n *= 2
  return tuple(sizes) + (s,)


def attend_one_prefix(q_Bx1xHxK, k_BxSxKvxK, v_BxSxKvxK, allowed_BxS, *, n: int):
  """`attend_one` over the first n cache positions only (keys past n must be masked)."""
  return attend_one(q_Bx1xHxK, k_BxSxKvxK[:, :n], v_BxSxKvxK[:, :n], allowed_BxS[:, :n])


def chunked_attend(q_BxTxHxK, k_BxSxKvxK, v_BxSxKvxK, allowed_BxTxS, *, chunk: int):
  """`attend` over blocks of `chunk` queries, so scores are [chunk, S], never [T, S].

  Each block is rematerialised in the backward pass, so training memory also stays at one
  block of scores.
  """
  t = q_BxTxHxK.shape[1]
  if t <= chunk:
    return attend(q_BxTxHxK, k_BxSxKvxK, v_BxSxKvxK, allowed_BxTxS)
  n = -(-t // chunk)
  pad = n * chunk - t
  q = jnp.pad(q_BxTxHxK, ((0, 0), (0, pad), (0, 0), (0, 0)))
  allowed = jnp.pad(allowed_BxTxS, ((0, 0), (0, pad), (0, 0)))
  b, _, h, k = q.shape
  q_n = q.reshape(b, n, chunk, h, k).swapaxes(0, 1)
  allowed_n = allowed.reshape(b, n, chunk, -1).swapaxes(0, 1)

  @jax.checkpoint
  def block(xs):
    q_blk, allowed_blk = xs
    return attend(q_blk, k_BxSxKvxK, v_BxSxKvxK, allowed_blk)

  o_n = jax.lax.map(block, (q_n, allowed_n))
  return o_n.swapaxes(0, 1).reshape(b, n * chunk, h, k)[:, :t]


def dense(x, w, *, in_dims: int = 1, out_dtype=None):
  """x's last `in_dims` axes contracted with w's first ones, as one [N, K] @ [K, M] matmul.

  Every projection goes through here, with the leading (batch, time) axes flattened: for the
  3-D einsum "btd,df->btf" the weight gradient contracts over two axes, and XLA:CPU lays the
  [B, T, F] activation gradient out again with a transposing copy before each weight-gradient
  dot (a third of the tiny model's update time); the 2-D form needs no copy. Same values.
  out_dtype: the matmul's accumulation / result type (default x's). w may be a
  `quant.Int8Weight` (int8 sampler weights): (x @ q) * scale per output channel, or a
  `lora.LoraWeight`: x @ w + ((x @ A) @ B) * scale.
  """
  if isinstance(w, lora.LoraWeight):
    y = dense(x, w.w, in_dims=in_dims, out_dtype=out_dtype)
    low = dense(dense(x, w.a, in_dims=in_dims), w.b, out_dtype=out_dtype)
    return y + (low * w.scale).astype(y.dtype)
  lead, k = x.shape[:x.ndim - in_dims], math.prod(x.shape[x.ndim - in_dims:])
  if isinstance(w, quant.Int8Weight):
    return quant.dense_int8(x.reshape(-1, k), w, k, out_dtype).reshape(*lead, *w.shape[in_dims:])
  y = jnp.matmul(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1),
                 preferred_element_type=out_dtype)
  return y.reshape(*lead, *w.shape[in_dims:])


def swiglu(x, w_gate, w_up, w_down):
  """SwiGLU MLP: down(silu(gate(x)) * up(x))."""
  return dense(jax.nn.silu(dense(x, w_gate)) * dense(x, w_up), w_down)


def decoder_layer(cfg: ModelConfig, p: dict, h, cos, sin, attention):
  """One pre-norm decoder layer; `attention(q, k, v) -> (out, aux)` hides cache handling.
  A MoE layer routes by its own router (`decoder_layer_routed` replays and reports routing)."""
  h, aux, _ = decoder_layer_routed(cfg, p, h, cos, sin, attention)
  return h, aux


def decoder_layer_routed(cfg: ModelConfig, p: dict, h, cos, sin, attention, *,
                         valid_BxT=None, replay_BxTxK=None, mesh=None):
  """`decoder_layer` -> (h, aux, routing): routing is the MoE layer's `moe.LayerRouting`
  (statistics over valid_BxT, default every token; replay_BxTxK: given expert ids), None
  for a dense MLP (p has "router" exactly when the layer is MoE)."""
  dt = h.dtype
  eps = cfg.rms_norm_eps
  x = rms_norm(h, p["attn_norm"], eps=eps)
  q, k, v = (dense(x, p[name]) for name in ("wq", "wk", "wv"))
  if cfg.attention_bias:
    q = q + p["bq"].astype(dt)[None, None]
    k = k + p["bk"].astype(dt)[None, None]
    v = v + p["bv"].astype(dt)[None, None]
  if cfg.qk_norm:
    q = rms_norm(q, p["q_norm"], eps=eps)
    k = rms_norm(k, p["k_norm"], eps=eps)
  q = apply_rope(q, cos, sin)
  k = apply_rope(k, cos, sin)
  o, aux = attention(q, k, v)
  h = h + dense(o, p["wo"], in_dims=2)
  x = rms_norm(h, p["mlp_norm"], eps=eps)
  if "router" not in p:
    return h + swiglu(x, p["w_gate"], p["w_up"], p["w_down"]), aux, None
  if valid_BxT is None:
    valid_BxT = jnp.ones(x.shape[:2], jnp.bool_)
  y, routing = moe.moe_block(cfg, p, x, valid_BxT=valid_BxT, replay_BxTxK=replay_BxTxK,
                             mesh=mesh)
  return h + y, aux, routing
