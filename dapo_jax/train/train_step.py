"""The per-step maths: one optimizer update on a mini-batch, and the log-prob pass.

`train_step` is a pure function of (state, minibatch); the trainer jits it once with the mesh's
shardings and donates the state. The mini-batch may be split into micro-batches (gradient
accumulation); the loss denominator is counted once over the whole mini-batch first, so the
update equals the one computed on the full mini-batch (core.losses' (sum, count) form).
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dapo_jax.core import losses, stats
from dapo_jax.models.qwen2 import token_logprobs
from dapo_jax.train.state import TrainState


@dataclasses.dataclass(frozen=True)
class LossOptions:
  """The static loss settings (hashable, so a jitted step is specialised on them)."""
  eps_low: float
  eps_high: float
  clip_c: float | None
  agg: str
  loss_scale_factor: float | None
  kl_coef: float
  kl_kind: str
  entropy_coef: float
  temperature: float
  micro_batch_size: int  # sequences; 0 = the whole mini-batch at once

  @classmethod
  def from_config(cls, cfg) -> "LossOptions":
    a = cfg.algo
    return cls(eps_low=a.eps_low, eps_high=a.eps_high, clip_c=a.clip_c or None,
               agg=a.loss_agg, loss_scale_factor=a.loss_scale_factor or None,
               kl_coef=a.kl_coef, kl_kind=a.kl_kind, entropy_coef=a.entropy_coef,
               temperature=cfg.rollout.temperature, micro_batch_size=cfg.train.micro_batch_size)


def logprobs(graphdef, params, tokens_BxS, attn_mask_BxS, *, temperature: float = 1.0,
             with_entropy: bool = True):
  """Per-token log-probs (and entropies) of a batch under `params`; no gradient."""
  model = nnx.merge(graphdef, params)
  return token_logprobs(model, tokens_BxS, attn_mask_BxS, temperature=temperature,
                        with_entropy=with_entropy)


def _objective(params, graphdef, mb, denominator, opts: LossOptions):
  model = nnx.merge(graphdef, params)
  need_entropy = opts.entropy_coef > 0
  logp, ent = token_logprobs(model, mb["tokens"], mb["attn_mask"], temperature=opts.temperature,
                             with_entropy=need_entropy)
  mask = mb["loss_mask"]
  pg_loss, aux = losses.policy_loss(
      logp, mb["old_logp"], mb["adv"], mask, eps_low=opts.eps_low, eps_high=opts.eps_high,
      clip_c=opts.clip_c, agg=opts.agg, loss_scale_factor=opts.loss_scale_factor,
      denominator=denominator)
  total = pg_loss
  aux = dict(aux, pg_loss=pg_loss)
  if opts.kl_coef > 0:  # not even traced when off: no reference forward exists then
    kl_BxT = stats.kl_estimate(logp, mb["ref_logp"], kind=opts.kl_kind) * mask
    kl = losses.aggregate(kl_BxT, mask, agg=opts.agg, loss_scale_factor=opts.loss_scale_factor,
                          denominator=denominator)
    total = total + opts.kl_coef * kl
    aux["kl_loss"] = kl
  if need_entropy:
    ent_loss = losses.aggregate(ent * mask, mask, agg=opts.agg,
                                loss_scale_factor=opts.loss_scale_factor, denominator=denominator)
    total = total - opts.entropy_coef * ent_loss
    aux["entropy_bonus"] = ent_loss
  return total, aux


_MEAN_AUX = ("clipfrac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual", "approx_kl",
             "ratio_mean")


def _combine_aux(aux_list):
  """Micro-batch aux -> mini-batch aux: token-weighted means, sums of sums, max of max."""
  n = sum(a["num_tokens"] for a in aux_list)
  safe = jnp.maximum(n, 1.0)
  out = {k: sum(a[k] * a["num_tokens"] for a in aux_list) / safe for k in _MEAN_AUX}
  n_up = sum(a["num_upclipped"] for a in aux_list)
  out["upclip_prob_mean"] = sum(a["upclip_prob_mean"] * a["num_upclipped"]
                                for a in aux_list) / jnp.maximum(n_up, 1.0)
  out["num_upclipped"] = n_up
  out["ratio_max"] = jnp.max(jnp.stack([a["ratio_max"] for a in aux_list]))
  out["num_tokens"] = n
  for k in ("pg_loss", "kl_loss", "entropy_bonus"):  # already divided by the global count
    if k in aux_list[0]:
      out[k] = sum(a[k] for a in aux_list)
  return out


def loss_and_grad(params, graphdef, minibatch, opts: LossOptions):
  """(loss, grads, aux) over the whole mini-batch, accumulated over micro-batches if asked."""
  denominator = losses.loss_denominator(minibatch["loss_mask"], agg=opts.agg)
  grad_fn = jax.value_and_grad(_objective, has_aux=True)
  B = minibatch["tokens"].shape[0]
  mbs = opts.micro_batch_size or B
  if B % mbs:
    raise ValueError(f"micro_batch_size: {mbs} does not divide the mini-batch of {B} sequences")
  k = B // mbs
  if k == 1:
    (loss, aux), grads = grad_fn(params, graphdef, minibatch, denominator, opts)
    return loss, grads, _combine_aux([aux])
  # A Python loop (unrolled in the trace) keeps each slice's activations separate; k is small.
  loss, grads, auxes = 0.0, None, []
  for i in range(k):
    mb = jax.tree.map(lambda x, i=i: x[i * mbs:(i + 1) * mbs], minibatch)
    (l, aux), g = grad_fn(params, graphdef, mb, denominator, opts)
    loss = loss + l
    grads = g if grads is None else jax.tree.map(jnp.add, grads, g)
    auxes.append(aux)
  return loss, grads, _combine_aux(auxes)


def train_step(state: TrainState, minibatch: dict[str, Any], *, graphdef, optimizer,
               opts: LossOptions):
  """One optimizer update. A non-finite loss or gradient leaves params and optimizer untouched
  (the update is skipped and reported as `skipped` = 1)."""
  loss, grads, aux = loss_and_grad(state.params, graphdef, minibatch, opts)
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
  new_params = jax.tree.map(lambda p, u: p + u.astype(p.dtype), state.params, updates)
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = TrainState(updates=state.updates + finite.astype(jnp.int32),
                         params=keep(new_params, state.params),
                         opt_state=keep(new_opt, state.opt_state))
  metrics = dict(aux, loss=loss, grad_norm=grad_norm, skipped=1.0 - finite.astype(jnp.float32))
  return new_state, metrics

