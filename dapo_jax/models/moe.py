"""The Qwen3-MoE feed-forward block: top-k routing, routing replay, and two expert computations.

Routing (HF Qwen3MoeTopKRouter): router logits z = x W_r [N, E] in the compute dtype,
p = softmax(z) in float32, each token goes to the k experts of largest p, and its gate weights
are p at those experts, divided by their sum when `norm_topk_prob` (Qwen3-30B-A3B sets it),
cast to the compute dtype. Routing is dropless: every token reaches all k of its experts;
there is no capacity factor and no token is dropped or padded away.

Routing replay: given expert ids (e.g. the sampler's), tokens go to those experts instead, and
the gate weights are still p (this router's softmax) gathered at the given ids and renormalised
the same way, so the router keeps its gradient. A row of ids < 0 routes that token by its own
top-k. Replaying a model's own ids reproduces its outputs exactly (the same operations run).

Expert computation (`ModelConfig.moe_impl`):
- "dense": every expert on every token, weighted by the [N, E] gate matrix (zero off the
  chosen experts): the reference, E/k times the work; on CPU with few experts it is also the
  fast form (XLA:CPU lowers ragged_dot to a masked dense product of the same cost).
- "grouped": the (token, slot) pairs sorted by expert and three `jax.lax.ragged_dot`s over the
  expert groups, work proportional to k (XLA:TPU's native ragged dot). Equal to "dense" in
  values and gradients (tests/test_moe.py). With a mesh it runs under `shard_map`: each batch
  shard routes its own tokens through the experts' weights, gathered over `fsdp` (as FSDP
  gathers any weight) and split over `tensor` (the expert MLP's channels, summed after).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P



class LayerRouting(NamedTuple):
  """One MoE layer's routing of a [B, T] batch (stacked over MoE layers: a leading [Lm])."""
  ids: jax.Array             # int32 [B, T, K]: each token's experts, by decreasing probability
  tokens_per_expert: jax.Array  # float32 [E]: (token, slot) pairs per expert, valid tokens only
  router_prob: jax.Array     # float32 [E]: router probability summed over valid tokens
  agree: jax.Array           # float32: valid tokens whose own top-k set is the one used


class Routing(NamedTuple):
  """A forward pass's routing over its MoE layers (`ModelConfig.moe_layers`, in order)."""
  expert_ids_LxBxTxK: jax.Array   # int32: the experts each token used (replayed ones if given)
  tokens_per_expert_LxE: jax.Array  # float32: expert load per layer over valid tokens
  router_prob_LxE: jax.Array      # float32: router probability per expert, summed likewise
  num_tokens: jax.Array           # float32 scalar: valid tokens (mask or segment ids > 0)
  agree_L: jax.Array              # float32 [Lm]: valid tokens whose router's own top-k set
                                  # equals the one used (all of them without replay)

  def load_balancing_loss(self):
    """The auxiliary loss of `load_balancing_loss` for this pass (the trainer may add
    router_aux_loss_coef times it to the policy loss)."""
    return load_balancing_loss(self.tokens_per_expert_LxE, self.router_prob_LxE,
                               self.num_tokens)


def route(x_NxD, w_router_DxE, *, k: int, norm_topk_prob: bool, replay_NxK=None):
  """(ids [N, K] int32, gate weights [N, K] in x's dtype, probabilities [N, E] float32)."""
  z_NxE = jnp.matmul(x_NxD, w_router_DxE.astype(x_NxD.dtype))
  p_NxE = jax.nn.softmax(z_NxE.astype(jnp.float32), axis=-1)
  ids_NxK = jax.lax.top_k(p_NxE, k)[1].astype(jnp.int32)
  if replay_NxK is not None:
    replay_NxK = replay_NxK.astype(jnp.int32)
    ids_NxK = jnp.where(replay_NxK[:, :1] >= 0, replay_NxK, ids_NxK)
  w_NxK = jnp.take_along_axis(p_NxE, ids_NxK, axis=-1)
  if norm_topk_prob:
    w_NxK = w_NxK / jnp.sum(w_NxK, axis=-1, keepdims=True)
  return ids_NxK, w_NxK.astype(x_NxD.dtype), p_NxE


def experts_dense(x_NxD, ids_NxK, w_NxK, gate_ExDxF, up_ExDxF, down_ExFxD):
  """Every expert on every token, summed with the gate weights (zero off the chosen ones).

  As 2-D matmuls (the form XLA:CPU runs fastest, `layers.dense`): [N, D] @ [D, 2EF] for the
  gate and up projections of all experts at once, then the gated activations [N, EF] @ [EF, D]
  (down is linear, so weighting before it is the same sum)."""
  e, d, f = gate_ExDxF.shape
  n, dt = x_NxD.shape[0], x_NxD.dtype
  gates_NxE = jnp.sum(jax.nn.one_hot(ids_NxK, e, dtype=w_NxK.dtype) * w_NxK[..., None], axis=1)
  w_in = jnp.concatenate([gate_ExDxF, up_ExDxF], axis=0).astype(dt)   # [2E, D, F]
  gu = jnp.matmul(x_NxD, w_in.transpose(1, 0, 2).reshape(d, 2 * e * f)).reshape(n, 2, e, f)
  a_NxExF = jax.nn.silu(gu[:, 0]) * gu[:, 1] * gates_NxE[:, :, None].astype(dt)
  return jnp.matmul(a_NxExF.reshape(n, e * f), down_ExFxD.astype(dt).reshape(e * f, d))


def experts_grouped(x_NxD, ids_NxK, w_NxK, gate_ExDxF, up_ExDxF, down_ExFxD):
  """(token, slot) pairs sorted by expert, one ragged_dot per projection over the groups."""
  n, k = ids_NxK.shape
  e, dt = gate_ExDxF.shape[0], x_NxD.dtype
  flat = ids_NxK.reshape(-1)
  order = jnp.argsort(flat, stable=True)           # pair index, grouped by expert
  sizes_E = jnp.bincount(flat, length=e).astype(jnp.int32)
  xs = jnp.take(x_NxD, order // k, axis=0)         # [N*K, D]
  g = jax.lax.ragged_dot(xs, gate_ExDxF.astype(dt), sizes_E)
  u = jax.lax.ragged_dot(xs, up_ExDxF.astype(dt), sizes_E)
  ys = jax.lax.ragged_dot(jax.nn.silu(g) * u, down_ExFxD.astype(dt), sizes_E)
  inverse = jnp.zeros_like(order).at[order].set(jnp.arange(n * k, dtype=order.dtype))
  y_NxKxD = jnp.take(ys, inverse, axis=0).reshape(n, k, -1)
  return jnp.einsum("nkd,nk->nd", y_NxKxD, w_NxK)


def _grouped_on_mesh(mesh, x_NxD, ids_NxK, w_NxK, gate, up, down):
  """`experts_grouped` per batch shard (shard_map): weights gathered over the other axes
  except `tensor`, which splits the expert channels (partial outputs summed over it)."""
  batch = tuple(a for a in ("data", "fsdp") if a in mesh.shape) or None
  t = "tensor" if "tensor" in mesh.shape and gate.shape[-1] % mesh.shape["tensor"] == 0 else None

  def local(x, ids, w, g, u, d):
    y = experts_grouped(x, ids, w, g, u, d)
    return jax.lax.psum(y, t) if t else y

  rows = P(batch, None)
  return jax.shard_map(local, mesh=mesh,
                       in_specs=(rows, rows, rows, P(None, None, t), P(None, None, t),
                                 P(None, t, None)),
                       out_specs=rows, check_vma=False)(x_NxD, ids_NxK, w_NxK, gate, up, down)


def _stats(ids_NxK, p_NxE, valid_N, e: int):
  v = valid_N.astype(jnp.float32)
  counts = jnp.zeros((e,), jnp.float32).at[ids_NxK.reshape(-1)].add(
      jnp.repeat(v, ids_NxK.shape[1]))
  return counts, jnp.sum(p_NxE * v[:, None], axis=0)


def moe_block(cfg, p: dict, x_BxTxD, *, valid_BxT, replay_BxTxK=None, mesh=None):
  """The MoE feed-forward of one layer -> (out [B, T, D], LayerRouting)."""
  b, t, d = x_BxTxD.shape
  k = cfg.num_experts_per_tok
  x = x_BxTxD.reshape(b * t, d)
  replay = None if replay_BxTxK is None else replay_BxTxK.reshape(b * t, k)
  ids, w, probs = route(x, p["router"], k=k, norm_topk_prob=cfg.norm_topk_prob,
                        replay_NxK=replay)
  weights = (p["we_gate"], p["we_up"], p["we_down"])
  if cfg.moe_impl == "dense":
    y = experts_dense(x, ids, w, *weights)
  elif mesh is not None and (b * t) % _batch_shards(mesh) == 0:
    y = _grouped_on_mesh(mesh, x, ids, w, *weights)
  else:
    y = experts_grouped(x, ids, w, *weights)
  valid = valid_BxT.reshape(-1)
  load, prob = _stats(ids, probs, valid, cfg.num_experts)
  return y.reshape(b, t, d), LayerRouting(ids.reshape(b, t, k), load, prob,
                                          _agree(ids, probs, valid, replayed=replay is not None))


def _agree(ids_NxK, p_NxE, valid_N, *, replayed: bool):
  """Valid tokens whose router's own top-k set equals the experts used (replay)."""
  v = valid_N.astype(jnp.float32)
  if not replayed:
    return jnp.sum(v)
  own = jnp.sort(jax.lax.top_k(p_NxE, ids_NxK.shape[1])[1].astype(jnp.int32), axis=-1)
  same = jnp.all(own == jnp.sort(ids_NxK, axis=-1), axis=-1)
  return jnp.sum(v * same.astype(jnp.float32))


def _batch_shards(mesh) -> int:
  return mesh.shape.get("data", 1) * mesh.shape.get("fsdp", 1)


def load_balancing_loss(tokens_per_expert_LxE, router_prob_LxE, num_tokens):
  """The router's auxiliary load-balancing loss, as transformers' Qwen3-MoE computes it
  (`load_balancing_loss_func`, Switch Transformer eqs. 4-6): over all MoE layers' valid tokens
  together, f_e = (token, slot) pairs routed to expert e / (layers x tokens) and
  P_e = mean router probability of e; loss = E * sum_e f_e P_e (k at uniform routing).
  num_tokens: valid tokens of the batch (the same in every layer)."""
  n_layers, e = tokens_per_expert_LxE.shape
  rows = jnp.maximum(n_layers * jnp.asarray(num_tokens, jnp.float32), 1.0)
  f_E = jnp.sum(tokens_per_expert_LxE, axis=0) / rows
  p_E = jnp.sum(router_prob_LxE, axis=0) / rows
  return e * jnp.sum(f_E * p_E)
