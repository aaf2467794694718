"""The per-step maths: one optimizer update on a mini-batch, and the log-prob pass.

`train_step(state, minibatch, *, graphdef, optimizer, cfg)` is a pure function; every loss knob
is read from the frozen `Config` (`cfg.algo`, nothing re-declared here). The trainer jits it
once with explicit shardings and donates the state. The mini-batch may be split into k
micro-batches (gradient accumulation, a `lax.scan`); micro-batch i holds rows i, i+k, i+2k, …, so
each one spans the data shards of a batch-sharded mini-batch. The model runs on packed rows
(several sequences per row, `train/packing.py`; the pack_* keys) and skips micro-batches that
hold none; the loss is taken on the per-sequence [B, S] arrays, so it is the padded layout's. Everything that needs the WHOLE
mini-batch is computed before the split: the loss denominator (core.losses' (sum, count) form),
the off-policy correction, and the tokens Clip-Cov / KL-Cov select. The update therefore equals
the one computed on the full mini-batch (tested).

Mini-batch keys: tokens, attn_mask, loss_mask, old_logp [B, S], adv [B]; ref_logp when
algo.kl_coef > 0; behav_logp (the sampler's log-probs) when algo.is_correction != "none" (with
it the mismatch metrics are reported whatever the correction).

Without old_logp the update is on-policy: the old log-probs are its own forward's, detached
(the ratio is 1 in value, its gradient that of logp), as when the step's only update runs at
the params that sampled (TRL's num_iterations = 1). The metrics then carry that forward's
per-token log-probs and entropies ([B, S], `TOKEN_KEYS`), so no separate pass is needed.
"""
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dapo_jax.config import Config
from dapo_jax.core import losses, offpolicy, stats
from dapo_jax.models.qwen2 import token_logprobs
from dapo_jax.train import packing
from dapo_jax.train import state as state_lib
from dapo_jax.train.state import TrainState


def logprobs(graphdef, params, tokens_BxS, attn_mask_BxS, *, temperature: float = 1.0,
             with_entropy: bool = True, positions_BxS=None, segment_ids_BxS=None, mesh=None):
  """Per-token log-probs (and entropies) of a batch under `params` (rows may be packed:
  segment ids and per-segment positions, `train/packing.py`); no gradient."""
  model = nnx.merge(graphdef, params)
  return token_logprobs(model, tokens_BxS, attn_mask_BxS, temperature=temperature,
                        with_entropy=with_entropy, positions_BxT=positions_BxS,
                        segment_ids_BxT=segment_ids_BxS, mesh=mesh)


def _micro_logprobs(params, graphdef, mb, rows, i, *, temperature, with_entropy, mesh):
  """Log-probs (and entropies) [B, S] of micro-batch i's sequences, computed on its packed
  `rows` (the micro-batch's pack_* rows) and gathered back; 0 for every other sequence."""
  seg = rows["pack_segments"]
  logp, ent = logprobs(graphdef, params, rows["pack_tokens"], seg > 0, temperature=temperature,
                       with_entropy=with_entropy, positions_BxS=rows["pack_positions"],
                       segment_ids_BxS=seg, mesh=mesh)
  valid = (mb["attn_mask"] > 0) & (mb["pack_micro"] == i)[:, None]
  gather = lambda x: jnp.where(valid, jnp.take(x.reshape(-1), mb["pack_src"]), 0.0)
  return gather(logp), (gather(ent) if with_entropy else None)


TOKEN_KEYS = ("token_logp", "token_entropy")  # the on-policy update's per-token outputs


def _objective(params, graphdef, mb, rows, i, denominator, cfg: Config, mesh):
  """Micro-batch i's share of the mini-batch loss (the global denominator divides it)."""
  a = cfg.algo
  on_policy = "old_logp" not in mb
  need_entropy = a.entropy_coef > 0 or on_policy
  logp, ent = _micro_logprobs(params, graphdef, mb, rows, i, mesh=mesh,
                              temperature=cfg.rollout.temperature, with_entropy=need_entropy)
  old_logp = jax.lax.stop_gradient(logp) if on_policy else mb["old_logp"]
  mask = mb["loss_mask"] * (mb["pack_micro"] == i)[:, None].astype(mb["loss_mask"].dtype)
  agg = dict(agg=a.loss_agg, loss_scale_factor=cfg.loss_scale_factor, denominator=denominator)
  pg_loss, aux = losses.policy_loss(
      logp, old_logp, mb["adv"], mask, mode=a.loss_mode, weight_BxT=mb.get("is_weight"),
      selected_BxT=mb.get("selected"), **agg, **a.loss_params())
  total = pg_loss
  aux = dict(aux, pg_loss=pg_loss)
  if on_policy:  # micro-batch i's rows (0 elsewhere): summed over micro-batches by the caller
    aux.update(zip(TOKEN_KEYS, map(jax.lax.stop_gradient, (logp, ent))))
  if a.kl_coef > 0:  # not even traced when off: no reference forward exists then
    kl = losses.aggregate(stats.kl_estimate(logp, mb["ref_logp"], kind=a.kl_kind) * mask, mask,
                          **agg)
    total = total + a.kl_coef * kl
    aux["kl_loss"] = kl
  if need_entropy:
    ent_loss = losses.aggregate(ent * mask, mask, **agg)
    total = total - a.entropy_coef * ent_loss
    aux["entropy_bonus"] = ent_loss
  return total, aux


_MEAN_AUX = ("clipfrac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual", "selected_frac",
             "approx_kl", "ratio_mean")


def _combine_aux(aux):
  """Stacked [k] micro-batch aux -> mini-batch aux: token-weighted means (up-clipped-token
  weighted for their mean probability), sums of the global-denominator losses, max of max."""
  n = jnp.sum(aux["num_tokens"])
  out = {k: jnp.sum(aux[k] * aux["num_tokens"]) / jnp.maximum(n, 1.0) for k in _MEAN_AUX}
  n_up = jnp.sum(aux["num_upclipped"])
  out["upclip_prob_mean"] = jnp.sum(aux["upclip_prob_mean"] * aux["num_upclipped"]) / (
      jnp.maximum(n_up, 1.0))
  out["num_upclipped"] = n_up
  out["ratio_max"] = jnp.max(aux["ratio_max"])
  out["num_tokens"] = n
  for k in ("pg_loss", "kl_loss", "entropy_bonus"):  # already divided by the global count
    if k in aux:
      out[k] = jnp.sum(aux[k])
  return out


def _split(x, k: int):
  """[B, ...] -> [k, B/k, ...] with micro-batch i = rows i, i+k, i+2k, … (strided)."""
  return x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)


def _off_policy(minibatch, cfg: Config):
  """The sampler-vs-trainer correction over the whole mini-batch (core.offpolicy)."""
  a = cfg.algo
  if "old_logp" not in minibatch and (a.is_correction != "none" or "behav_logp" in minibatch):
    raise ValueError("train_step: an on-policy mini-batch (no 'old_logp') has no trainer "
                     "log-probs to weigh the sampler's ('behav_logp') against; needs "
                     f"config.algo.is_correction='none' (got {a.is_correction!r}) and no "
                     "'behav_logp'")
  if "behav_logp" not in minibatch:
    if a.is_correction != "none":
      raise ValueError(f"config.algo.is_correction={a.is_correction!r} needs the sampler's "
                       "log-probs in the mini-batch under key 'behav_logp'")
    return minibatch, {}
  weight, mask, aux = offpolicy.is_correction(minibatch["old_logp"], minibatch["behav_logp"],
                                              minibatch["loss_mask"], kind=a.is_correction,
                                              cap=a.is_cap)
  mb = dict(minibatch, loss_mask=mask)
  if a.is_correction.startswith("tis"):
    mb["is_weight"] = weight
  return mb, aux


def _select(params, graphdef, mb, rows_k, n_used, cfg: Config, key, mesh):
  """Clip-Cov / KL-Cov token selection from a no-gradient log-prob pass over the mini-batch."""
  a = cfg.algo

  def add(i, acc):
    rows = jax.tree.map(lambda x: x[i], rows_k)
    return acc + _micro_logprobs(params, graphdef, mb, rows, i, mesh=mesh, with_entropy=False,
                                 temperature=cfg.rollout.temperature)[0]

  zeros = jnp.zeros(mb["loss_mask"].shape, jnp.float32)
  logp = jax.lax.stop_gradient(jax.lax.fori_loop(0, n_used, add, zeros))
  return losses.select_tokens(logp, mb["old_logp"], mb["adv"], mb["loss_mask"],
                              mode=a.loss_mode, key=key, **a.loss_params())


def _micro_batches(minibatch, cfg: Config) -> int:
  b = minibatch["tokens"].shape[0]
  mbs = cfg.train.micro_batch_size or b
  if b % mbs:
    raise ValueError(f"micro_batch_size: {mbs} does not divide the mini-batch of {b} sequences")
  return b // mbs


def loss_and_grad(params, graphdef, minibatch, cfg: Config, *, key=None, mesh=None):
  """(loss, grads, aux) over the whole mini-batch, accumulated over micro-batches if asked.
  The model runs on the packing plan's rows (pack_* keys, `train/packing.py`; without them
  every sequence is its own row), only on micro-batches that hold a sequence.
  key: for Clip-Cov's random pick (default PRNGKey(cfg.seed)). mesh: training attention's."""
  k = _micro_batches(minibatch, cfg)
  mb, is_aux = _off_policy(minibatch, cfg)
  if "pack_src" not in mb:
    mb = dict(mb, **packing.identity_plan(mb["tokens"], mb["attn_mask"], micro_batches=k))
  rows_k = {n: _split(mb[n], k) for n in packing.KEYS[:3]}
  n_used = jnp.max(mb["pack_micro"]) + 1
  denominator = losses.loss_denominator(mb["loss_mask"], agg=cfg.algo.loss_agg)
  if losses.MODES[cfg.algo.loss_mode].selects:
    if "old_logp" not in mb:
      raise ValueError(f"train_step: loss_mode {cfg.algo.loss_mode!r} selects tokens from the "
                       "old log-probs before the update; the mini-batch needs 'old_logp'")
    key = jax.random.PRNGKey(cfg.seed) if key is None else key
    mb = dict(mb, selected=_select(params, graphdef, mb, rows_k, n_used, cfg, key, mesh))
  grad_fn = jax.value_and_grad(_objective, has_aux=True)
  run = lambda i, rows: grad_fn(params, graphdef, mb, rows, i, denominator, cfg, mesh)
  shapes = jax.eval_shape(run, 0, jax.tree.map(lambda x: x[0], rows_k))
  skip = lambda i, rows: jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)

  def body(carry, xs):
    (l, aux), g = jax.lax.cond(xs[0] < n_used, run, skip, *xs)
    per_token = {name: aux.pop(name) for name in TOKEN_KEYS if name in aux}
    return jax.tree.map(jnp.add, carry, (l, g, per_token)), aux

  per_token = {n: jnp.zeros(shapes[0][1][n].shape, jnp.float32)
               for n in TOKEN_KEYS if n in shapes[0][1]}
  zeros = (jnp.zeros((), jnp.float32), jax.tree.map(jnp.zeros_like, params), per_token)
  (loss, grads, per_token), aux = jax.lax.scan(body, zeros, (jnp.arange(k), rows_k))
  return loss, grads, dict(_combine_aux(aux), **is_aux, **per_token)


def train_step(state: TrainState, minibatch: dict[str, Any], *, graphdef, optimizer,
               cfg: Config, mesh=None):
  """One optimizer update. A non-finite loss, gradient, update or new parameter leaves params and
  optimizer untouched (skipped, reported as `skipped` = 1): a corrupt optimizer state can never
  write NaN weights. `lr` is the learning rate this update
  used (cfg.optim's schedule at the count of applied updates, which the optimizer shares)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), state.updates)
  loss, grads, aux = loss_and_grad(state.params, graphdef, minibatch, cfg, key=key, mesh=mesh)
  grad_norm = optax.tree.norm(grads)
  updates, new_opt = optimizer.update(grads, state.opt_state, state.params)
  new_params = jax.tree.map(lambda p, u: p + u.astype(p.dtype), state.params, updates)
  finite = (jnp.isfinite(loss) & jnp.isfinite(grad_norm) & jnp.isfinite(optax.tree.norm(updates))
            & jnp.isfinite(optax.tree.norm(new_params)))
  keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(finite, n, o), new, old)
  new_state = TrainState(updates=state.updates + finite.astype(jnp.int32),
                         params=keep(new_params, state.params),
                         opt_state=keep(new_opt, state.opt_state))
  lr = state_lib.lr_schedule(lr=cfg.optim.lr, warmup_updates=cfg.warmup_updates)(state.updates)
  metrics = dict(aux, loss=loss, grad_norm=grad_norm, lr=lr,
                 skipped=1.0 - finite.astype(jnp.float32))
  return new_state, metrics
