"""Chunked log-probs (and entropies) of given tokens under the policy, optionally routed."""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from dapo_jax import sharding
from dapo_jax.models import layers as L


def _check_bt(name, x, ndim=2):
  if x.ndim != ndim:
    raise ValueError(f"{name} must have rank {ndim}, got shape {x.shape}")


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


def token_logprobs(model, tokens_BxT, mask_BxT, *, temperature: float = 1.0,
                   chunk_size: int | None = None, with_entropy: bool = True,
                   positions_BxT=None, segment_ids_BxT=None, mesh=None,
                   expert_ids_LxBxTxK=None):
  """Log-probs (and entropies) of the given tokens, in chunks of the flattened sequence.

  logp[:, t] = log softmax(logits[:, t-1] / temperature)[tokens[:, t]], logp[:, 0] = 0;
  entropy[:, t] is the entropy of that distribution; both are 0 where mask_BxT is 0.
  A chunk covers about `chunk_size` tokens (max(1, chunk_size // B) positions of every row,
  so batch sharding is kept), each chunk's logits are rematerialised in the backward pass:
  at most one [B, chunk, V] float32 block lives at a time. Returns (logp, entropy or None).
  Packed rows (`train/packing.py`) pass their per-segment positions and segment ids; the first
  token of each segment then gets a junk value (it follows another segment), which its mask
  hides: it is a prompt token. `mesh`: for the training attention and the grouped experts
  (`Qwen2._full`). expert_ids_LxBxTxK: routing replay (MoE; `Qwen2.hidden_routed`).
  """
  return routed_token_logprobs(
      model, tokens_BxT, mask_BxT, temperature=temperature, chunk_size=chunk_size,
      with_entropy=with_entropy, positions_BxT=positions_BxT, segment_ids_BxT=segment_ids_BxT,
      mesh=mesh, expert_ids_LxBxTxK=expert_ids_LxBxTxK)[:2]


def routed_token_logprobs(model, tokens_BxT, mask_BxT, *, temperature: float = 1.0,
                          chunk_size: int | None = None, with_entropy: bool = True,
                          positions_BxT=None, segment_ids_BxT=None, mesh=None,
                          expert_ids_LxBxTxK=None):
  """`token_logprobs` -> (logp, entropy or None, moe.Routing or None for a dense model): the
  experts every token used per MoE layer, the expert load and the load-balancing loss."""
  chunk_size = _check_logprob_args(model, tokens_BxT, mask_BxT, temperature, chunk_size)
  b, t = tokens_BxT.shape
  h_BxTxD, routing = model.hidden_routed(tokens_BxT, mask_BxT, positions_BxT,
                                         segment_ids_BxT=segment_ids_BxT, mesh=mesh,
                                         expert_ids_LxBxTxK=expert_ids_LxBxTxK)
  if t == 1:
    zeros = jnp.zeros((b, t), jnp.float32)
    return zeros, (zeros if with_entropy else None), routing
  chunked = _chunked
  if (shards := sharding.context_size(mesh)) > 1:
    chunked = functools.partial(_context_chunked, shards=shards, mesh=mesh)
  logp, ent = chunked(model.output_weight(), h_BxTxD, tokens_BxT, mask_BxT,
                      temperature=temperature, chunk_size=chunk_size, with_entropy=with_entropy)
  return logp, ent, routing


def _logp_entropy(w_DxV, h_xD, y_x, *, temperature, with_entropy):
  """Log-probs of targets y (and entropies) from hidden states h, rematerialised in the
  backward pass (one chunk's logits at a time)."""
  @jax.checkpoint
  def chunk(h_xD, y_x):
    z = L.dense(h_xD, w_DxV, out_dtype=jnp.float32) / temperature
    lse = jax.nn.logsumexp(z, axis=-1)
    logp = jnp.take_along_axis(z, y_x[..., None], axis=-1)[..., 0] - lse
    if not with_entropy:
      return logp, None
    p = jnp.exp(z - lse[..., None])
    return logp, lse - jnp.sum(p * z, axis=-1)
  return chunk(h_xD, y_x)


def _context_chunked(w_DxV, h_BxTxD, tokens_BxT, mask_BxT, *, shards, mesh, temperature,
                     chunk_size, with_entropy):
  """`_chunked` for hidden states split over the mesh's context axis: each shard's positions
  predict their next token (targets shifted instead of the hidden states, so nothing of h
  moves between shards), in chunks of about chunk_size tokens over all shards; the per-token
  results are shifted back to the token they score."""
  b, t, d = h_BxTxD.shape
  if t % shards:
    raise ValueError(f"token_logprobs: {t} positions do not split over mesh.context={shards}")
  tl = t // shards
  c = min(max(1, chunk_size // (b * shards)), tl)
  n = -(-tl // c)
  pad = ((0, 0), (0, 0), (0, n * c - tl))
  lay = lambda x: jnp.moveaxis(  # noqa: E731  [B, T, ...] -> [n, B, shards, c, ...]
      jnp.pad(x.reshape(b, shards, tl, *x.shape[2:]), pad + ((0, 0),) * (x.ndim - 2))
      .reshape(b, shards, n, c, *x.shape[2:]), 2, 0)
  split = lambda x: sharding.constrain_tokens(  # noqa: E731
      x, mesh, names=(None, "batch", "seq"))
  h_n = split(lay(h_BxTxD))
  y_n = split(lay(jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, 1)))))
  step = functools.partial(_logp_entropy, w_DxV, temperature=temperature,
                           with_entropy=with_entropy)
  _, (logp_n, ent_n) = jax.lax.scan(lambda _, xs: (None, step(*xs)), None, (h_n, y_n))

  def unchunk(x_n):  # position t's score of token t + 1 -> token t + 1's entry
    x = jnp.moveaxis(x_n, 0, 2).reshape(b, shards, n * c)[:, :, :tl].reshape(b, t)
    x = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), x[:, :-1]], axis=1)
    return jnp.where(mask_BxT > 0, x, 0.0)

  return unchunk(logp_n), (unchunk(ent_n) if with_entropy else None)


def _chunked(w_DxV, h_BxTxD, tokens_BxT, mask_BxT, *, temperature, chunk_size, with_entropy):
  """Log-probs (and entropies) from the hidden states, chunk by chunk (`token_logprobs`)."""
  b, t = tokens_BxT.shape
  c = max(1, chunk_size // b)
  n = -(-(t - 1) // c)
  pad = n * c - (t - 1)
  h_prev = jnp.pad(h_BxTxD[:, :-1], ((0, 0), (0, pad), (0, 0)))
  targets = jnp.pad(tokens_BxT[:, 1:], ((0, 0), (0, pad)))
  h_n = h_prev.reshape(b, n, c, -1).swapaxes(0, 1)
  y_n = targets.reshape(b, n, c).swapaxes(0, 1)

  chunk = functools.partial(_logp_entropy, w_DxV, temperature=temperature,
                            with_entropy=with_entropy)
  _, (logp_n, ent_n) = jax.lax.scan(lambda _, xs: (None, chunk(*xs)), None, (h_n, y_n))

  def unchunk(x_n):
    x = x_n.swapaxes(0, 1).reshape(b, n * c)[:, : t - 1]
    x = jnp.concatenate([jnp.zeros((b, 1), jnp.float32), x], axis=1)
    return jnp.where(mask_BxT > 0, x, 0.0)

  return unchunk(logp_n), (unchunk(ent_n) if with_entropy else None)
