"""A mini-batch's loss and gradients, accumulated exactly over micro-batches (no optimizer).

The mini-batch may be split into k micro-batches (gradient accumulation, a `lax.scan`);
micro-batch i holds rows i, i+k, i+2k, …, so each one spans the data shards of a batch-sharded
mini-batch. The model runs on packed rows (several sequences per row, `train/packing.py`) and
skips micro-batches that hold none; the loss is taken on the per-sequence [B, S] arrays, so it is
the padded layout's. Everything that needs the WHOLE mini-batch is computed before the split:
the loss denominator (core.losses' (sum, count) form), the off-policy correction, and the tokens
Clip-Cov / KL-Cov select. The result therefore equals the full mini-batch's (tested).

An on-policy mini-batch (no old log-probs) takes them from its own forward, detached: the ratio
is 1 in value, its gradient that of log pi (TRL's num_iterations = 1); that forward's per-token
log-probs and entropies come back as `TokenStats`.
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from dapo_jax.config import Config
from dapo_jax.core import losses, offpolicy, stats
from dapo_jax.core.losses import PolicyLossStats
from dapo_jax.models import lora
from dapo_jax.models.qwen2 import routed_token_logprobs
from dapo_jax.train import packing
from dapo_jax.train.batch import TokenStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _WholeBatch:
  """What is decided over the whole mini-batch before it is split (None where unused)."""
  is_weight_BxS: Any    # the off-policy correction's per-token weights (tis_*)
  selected_BxS: Any     # Clip-Cov / KL-Cov's selected tokens
  num_tokens: Any = None  # valid (prompt and response) tokens: the router loss's weights


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class _Terms:
  """One micro-batch's share of the objective's terms (each divided by the global count)."""
  pg_loss: Any
  kl_loss: Any          # None unless algo.kl_coef > 0
  entropy_bonus: Any    # None unless an entropy term or an on-policy forward computes it
  stats: PolicyLossStats
  route: Any = None     # RouteStats of a MoE model's forward, else None


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class RouteStats:
  """A MoE forward's routing over its valid tokens (sums, so micro-batches add up)."""
  agree: Any            # token-layers whose router's own top-k set is the experts used
  token_layers: Any     # valid tokens x MoE layers
  load_LxE: Any         # (token, slot) pairs per expert and MoE layer
  balance_x_tokens: Any  # the forward's load-balancing loss x its valid tokens
  tokens: Any           # valid tokens

  @staticmethod
  def of(routing) -> "RouteStats | None":
    if routing is None:
      return None
    return RouteStats(agree=jnp.sum(routing.agree_L),
                      token_layers=routing.num_tokens * routing.agree_L.shape[0],
                      load_LxE=routing.tokens_per_expert_LxE,
                      balance_x_tokens=routing.load_balancing_loss() * routing.num_tokens,
                      tokens=routing.num_tokens)


def route_metrics(route_k: RouteStats, *, replayed: bool) -> dict:
  """routing_agreement (replay: share of token-layers where the trainer's router picks the
  sampler's top-k set) and expert_load_max (the most loaded expert's tokens over the mean,
  the worst MoE layer; 1 = balanced) and router_aux_loss (the load-balancing loss, the
  micro-batches' token-weighted mean) from stacked micro-batch RouteStats."""
  load_LxE = jnp.sum(route_k.load_LxE, axis=0)
  mean_L = jnp.maximum(jnp.mean(load_LxE, axis=-1), 1e-9)
  out = {"expert_load_max": jnp.max(jnp.max(load_LxE, axis=-1) / mean_L),
         "router_aux_loss": (jnp.sum(route_k.balance_x_tokens)
                             / jnp.maximum(jnp.sum(route_k.tokens), 1.0))}
  if replayed:
    out["routing_agreement"] = (jnp.sum(route_k.agree)
                                / jnp.maximum(jnp.sum(route_k.token_layers), 1.0))
  return out


def logprobs(graphdef, params, tokens_BxS, attn_mask_BxS, *, temperature: float = 1.0,
             with_entropy: bool = True, positions_BxS=None, segment_ids_BxS=None, mesh=None,
             expert_ids_BxSxLxK=None):
  """Per-token (log-probs, entropies or None, moe.Routing or None) of a batch under `params`
  (rows may be packed: segment ids and per-segment positions, `train/packing.py`);
  expert_ids_BxSxLxK: the experts to route each token by (routing replay; -1 = its own)."""
  model = lora.merge(graphdef, params)  # params: a state, or (adapters, frozen base)
  replay = None if expert_ids_BxSxLxK is None else expert_ids_BxSxLxK.transpose(2, 0, 1, 3)
  return routed_token_logprobs(model, tokens_BxS, attn_mask_BxS, temperature=temperature,
                               with_entropy=with_entropy, positions_BxT=positions_BxS,
                               segment_ids_BxT=segment_ids_BxS, mesh=mesh,
                               expert_ids_LxBxTxK=replay)


def _micro_logprobs(params, graphdef, mb, rows, i, *, temperature, with_entropy, mesh):
  """(log-probs, entropies or None) [B, S] of micro-batch i's sequences, computed on its
  packed `rows` ((tokens, segments, positions[, expert ids]) [R, S, ...]) and gathered back (0
  for every other sequence), and the forward's RouteStats (None for a dense model)."""
  tokens, seg, positions = rows[:3]
  logp, ent, routing = logprobs(graphdef, params, tokens, seg > 0, temperature=temperature,
                                with_entropy=with_entropy, positions_BxS=positions,
                                segment_ids_BxS=seg, mesh=mesh,
                                expert_ids_BxSxLxK=rows[3] if len(rows) > 3 else None)
  valid = (mb.attn_mask_BxS > 0) & (mb.pack.micro_B == i)[:, None]
  gather = lambda x: jnp.where(valid, jnp.take(x.reshape(-1), mb.pack.src_BxS), 0.0)
  return gather(logp), (gather(ent) if with_entropy else None), RouteStats.of(routing)


def _objective(params, graphdef, mb, whole: _WholeBatch, rows, i, denominator, cfg: Config,
               mesh):
  """(micro-batch i's share of the mini-batch loss, (its _Terms, its TokenStats or None))."""
  algo = cfg.algo
  need_entropy = algo.entropy_coef > 0 or mb.on_policy
  logp, ent, route = _micro_logprobs(params, graphdef, mb, rows, i, mesh=mesh,
                                     temperature=cfg.rollout.temperature,
                                     with_entropy=need_entropy)
  old_logp = jax.lax.stop_gradient(logp) if mb.on_policy else mb.old_logp_BxS
  mask = mb.loss_mask_BxS * (mb.pack.micro_B == i)[:, None].astype(mb.loss_mask_BxS.dtype)
  agg = dict(agg=algo.loss_agg, loss_scale_factor=cfg.loss_scale_factor, denominator=denominator)
  pg_loss, pl_stats = losses.policy_loss(
      logp, old_logp, mb.adv_B, mask, mode=algo.loss_mode, weight_BxT=whole.is_weight_BxS,
      selected_BxT=whole.selected_BxS, **agg, **algo.loss_params())
  total, kl, ent_loss = pg_loss, None, None
  if algo.kl_coef > 0:  # not even traced when off: no reference forward exists then
    if mb.ref_logp_BxS is None:
      raise ValueError(f"config.algo.kl_coef={algo.kl_coef} needs the reference policy's "
                       "log-probs in the mini-batch (MiniBatch.ref_logp_BxS)")
    kl = losses.aggregate(stats.kl_estimate(logp, mb.ref_logp_BxS, kind=algo.kl_kind) * mask,
                          mask, **agg)
    total = total + algo.kl_coef * kl
  if need_entropy:
    ent_loss = losses.aggregate(ent * mask, mask, **agg)
    total = total - algo.entropy_coef * ent_loss
  if algo.router_aux_coef > 0:  # Switch's loss is not a sum over tokens: weight each
    if route is None:           # micro-batch's own by its share of the mini-batch's tokens
      raise ValueError(f"config.algo.router_aux_coef={algo.router_aux_coef} needs a "
                       "mixture-of-experts model; this one has no router")
    total = total + algo.router_aux_coef * route.balance_x_tokens / whole.num_tokens
  tokens = TokenStats(*map(jax.lax.stop_gradient, (logp, ent))) if mb.on_policy else None
  return total, (_Terms(pg_loss, kl, ent_loss, pl_stats, route), tokens)


_MEAN_STATS = ("clipfrac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual", "selected_frac",
               "approx_kl", "ratio_mean")


def _combine(terms_k: _Terms, *, replayed: bool) -> dict:
  """Stacked [k] micro-batch terms -> the mini-batch's metrics: token-weighted means
  (up-clipped-token weighted for their mean probability), sums of the global-denominator
  losses, max of max."""
  s = terms_k.stats
  n, n_up = jnp.sum(s.num_tokens), jnp.sum(s.num_upclipped)
  out = {k: jnp.sum(s[k] * s.num_tokens) / jnp.maximum(n, 1.0) for k in _MEAN_STATS}
  out["upclip_prob_mean"] = jnp.sum(s.upclip_prob_mean * s.num_upclipped) / jnp.maximum(n_up, 1.0)
  out.update(num_upclipped=n_up, ratio_max=jnp.max(s.ratio_max), num_tokens=n)
  for k in ("pg_loss", "kl_loss", "entropy_bonus"):  # already divided by the global count
    if getattr(terms_k, k) is not None:
      out[k] = jnp.sum(getattr(terms_k, k))
  if terms_k.route is not None:
    out.update(route_metrics(terms_k.route, replayed=replayed))
  return out


def _split(x, k: int):
  """[B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, i+2k, … (strided)."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _off_policy(mb, cfg: Config):
  """The sampler-vs-trainer correction over the whole mini-batch (core.offpolicy): (the
  mini-batch with its corrected loss mask, the IS weights or None, metrics)."""
  algo = cfg.algo
  if mb.on_policy and (algo.corrects_off_policy() or mb.behav_logp_BxS is not None):
    raise ValueError("train_step: an on-policy mini-batch (no old_logp_BxS) has no trainer "
                     "log-probs to weigh the sampler's (behav_logp_BxS) against; needs "
                     f"config.algo.is_correction='none' (got {algo.is_correction!r}), "
                     "rollout_is and rollout_rs 'none', and no behav_logp_BxS")
  if mb.behav_logp_BxS is None:
    if algo.corrects_off_policy():
      raise ValueError(f"config.algo.is_correction={algo.is_correction!r} / rollout_is="
                       f"{algo.rollout_is!r} / rollout_rs={algo.rollout_rs!r} needs the "
                       "sampler's log-probs in the mini-batch (MiniBatch.behav_logp_BxS)")
    return mb, None, {}
  if algo.rollout_is != "none" or algo.rollout_rs != "none":
    return _rollout_correction(mb, algo)
  weight, mask, aux = offpolicy.is_correction(mb.old_logp_BxS, mb.behav_logp_BxS,
                                              mb.loss_mask_BxS, kind=algo.is_correction,
                                              cap=algo.is_cap)
  weight = weight if algo.is_correction.startswith("tis") else None
  return dataclasses.replace(mb, loss_mask_BxS=mask), weight, aux


def _rollout_correction(mb, algo):
  """verl's family: IS weights (rollout_is) and a rejection mask (rollout_rs), both from the
  trainer − sampler log-ratio over the loss mask's tokens, as verl applies them together."""
  mask = mb.loss_mask_BxS
  log_ratio = (mb.old_logp_BxS - mb.behav_logp_BxS) * mask
  aux = {"is_logp_diff_abs_mean": jnp.sum(jnp.abs(log_ratio)) / jnp.maximum(jnp.sum(mask), 1.0)}
  weight = None
  if algo.rollout_is != "none":
    weight, is_aux = offpolicy.is_weights(log_ratio, mask, level=algo.rollout_is,
                                          threshold=algo.rollout_is_threshold)
    aux.update(is_aux)
  if algo.rollout_rs != "none":
    mask, rs_aux = offpolicy.rejection_mask(log_ratio, mask, options=algo.rollout_rs,
                                            thresholds=algo.rollout_rs_threshold)
    aux.update(rs_aux)
  return dataclasses.replace(mb, loss_mask_BxS=mask), weight, aux


def _select(params, graphdef, mb, rows_k, n_used, cfg: Config, key, mesh):
  """Clip-Cov / KL-Cov token selection from a no-gradient log-prob pass over the mini-batch."""
  algo = cfg.algo
  if mb.on_policy:
    raise ValueError(f"train_step: loss_mode {algo.loss_mode!r} selects tokens from the old "
                     "log-probs before the update; the mini-batch needs old_logp_BxS")

  def add(i, acc):
    rows = jax.tree.map(lambda x: x[i], rows_k)
    return acc + _micro_logprobs(params, graphdef, mb, rows, i, mesh=mesh, with_entropy=False,
                                 temperature=cfg.rollout.temperature)[0]

  zeros = jnp.zeros(mb.loss_mask_BxS.shape, jnp.float32)
  logp = jax.lax.stop_gradient(jax.lax.fori_loop(0, n_used, add, zeros))
  return losses.select_tokens(logp, mb.old_logp_BxS, mb.adv_B, mb.loss_mask_BxS,
                              mode=algo.loss_mode, key=key, **algo.loss_params())


def _micro_batches(mb, cfg: Config) -> int:
  b = mb.tokens_BxS.shape[0]
  mbs = cfg.train.micro_batch_size or b
  if b % mbs:
    raise ValueError(f"micro_batch_size: {mbs} does not divide the mini-batch of {b} sequences")
  return b // mbs


def loss_and_grad(params, graphdef, minibatch, cfg: Config, *, key=None, mesh=None):
  """(loss, grads, metrics, TokenStats or None) over the whole mini-batch (a train_step
  MiniBatch), accumulated over micro-batches if asked. The model runs on the packing plan's rows
  (without one, every sequence is its own row), only on micro-batches that hold a sequence.
  key: for Clip-Cov's random pick (default PRNGKey(cfg.seed)). mesh: training attention's."""
  k = _micro_batches(minibatch, cfg)
  mb, weight, is_aux = _off_policy(minibatch, cfg)
  if mb.pack is None:
    mb = dataclasses.replace(mb, pack=packing.identity_plan(mb.tokens_BxS, mb.attn_mask_BxS,
                                                            micro_batches=k))
  p = mb.pack
  ids = () if mb.expert_ids_BxSxLxK is None else (mb.expert_ids_BxSxLxK,)  # the plan's rows
  rows_k = tuple(_split(x, k) for x in (p.tokens_BxS, p.segments_BxS, p.positions_BxS, *ids))
  n_used = jnp.max(p.micro_B) + 1
  denominator = losses.loss_denominator(mb.loss_mask_BxS, agg=cfg.algo.loss_agg)
  selected = None
  if losses.MODES[cfg.algo.loss_mode].selects:
    key = jax.random.PRNGKey(cfg.seed) if key is None else key
    selected = _select(params, graphdef, mb, rows_k, n_used, cfg, key, mesh)
  whole = _WholeBatch(is_weight_BxS=weight, selected_BxS=selected,
                      num_tokens=jnp.maximum(jnp.sum(mb.attn_mask_BxS > 0), 1))
  trainable, frozen = lora.parts(params)  # LoRA: gradients of the adapters only
  grad_fn = jax.value_and_grad(lambda t, *a: _objective(lora.join(t, frozen), *a), has_aux=True)
  run = lambda i, rows: grad_fn(trainable, graphdef, mb, whole, rows, i, denominator, cfg, mesh)
  shapes = jax.eval_shape(run, 0, jax.tree.map(lambda x: x[0], rows_k))
  skip = lambda i, rows: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def body(carry, xs):
    (l, (terms, tokens)), g = jax.lax.cond(xs[0] < n_used, run, skip, *xs)
    return jax.tree.map(jnp.add, carry, (l, g, tokens)), terms

  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (shapes[0][0], shapes[1],
                                                               shapes[0][1][1]))
  (loss, grads, tokens), terms_k = jax.lax.scan(body, zeros, (jnp.arange(k), rows_k))
  return loss, grads, dict(_combine(terms_k, replayed=bool(ids)), **is_aux), tokens
