"""The full-sequence layer loop: every decoder layer under lax.scan or unrolled.

Scan keeps compile time flat in depth; unrolled avoids the scan's per-layer weight slices and,
in the backward pass, its stacked gradient / residual updates (faster on CPU). A model mixing
dense and MoE layers always runs unrolled (one scan runs one layer body).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax import sharding
from dapo_jax.models import layers as L
from dapo_jax.models import moe


def check_replay(cfg, ids, lead: tuple, name: str):
  """Replayed expert ids must be [Lm, *lead, K] for a model with Lm MoE layers."""
  if ids is None:
    return
  want = (len(cfg.moe_layers), *lead, cfg.num_experts_per_tok)
  if not cfg.moe_layers:
    raise ValueError(f"{name}: the model has no MoE layer to replay routing in")
  if tuple(ids.shape) != want:
    raise ValueError(f"{name} shape {tuple(ids.shape)} != {want} "
                     "(MoE layers, batch..., experts per token)")


def stack(trees):
  return jax.tree.map(lambda *xs: jnp.stack(xs), *trees)


def run(cfg, layers, h, cos, sin, attention, *, valid_BxT, replay_LxBxTxK=None, mesh=None):
  """Every layer -> (h, stacked attention aux [L, ...], stacked `moe.LayerRouting` [Lm, ...]
  or None for a dense model). replay_LxBxTxK: expert ids per MoE layer (routing replay)."""
  def body(h, xs):
    p, replay = xs
    h = sharding.constrain_tokens(h, mesh)  # each layer's input split over context, if any
    h, aux, routing = L.decoder_layer_routed(cfg, p, h, cos, sin, attention,
                                             valid_BxT=valid_BxT, replay_BxTxK=replay,
                                             mesh=mesh)
    return h, (aux, routing)

  if cfg.remat:
    body = jax.checkpoint(body, prevent_cse=False,
                          policy=jax.checkpoint_policies.nothing_saveable)
  if cfg.scan_layers and not cfg.mixed_layers:
    return _scanned(body, h, layers.arrays(), replay_LxBxTxK)
  auxes, routings = [], []
  for p in layers.layer_params():
    replay = None
    if "router" in p and replay_LxBxTxK is not None:
      replay = replay_LxBxTxK[len(routings)]
    h, (aux, routing) = body(h, (p, replay))
    auxes.append(aux)
    if routing is not None:
      routings.append(routing)
  return h, stack(auxes), (stack(routings) if routings else None)


def _scanned(body, h, arrays, replay):
  h, (aux, routing) = jax.lax.scan(body, h, (arrays, replay))
  return h, aux, routing


def routing_of(cfg, layer_routing, valid_BxT) -> moe.Routing | None:
  """The pass's `moe.Routing` from the stacked per-layer routing (None for a dense model)."""
  if layer_routing is None:
    return None
  return moe.Routing(expert_ids_LxBxTxK=layer_routing.ids,
                     tokens_per_expert_LxE=layer_routing.tokens_per_expert,
                     router_prob_LxE=layer_routing.router_prob,
                     num_tokens=jnp.sum(valid_BxT.astype(jnp.float32)),
                     agree_L=layer_routing.agree)
