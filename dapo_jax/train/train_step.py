"""The update: its input (`MiniBatch`), one optimizer step (`train_step`), and its jit.

`train_step(state, minibatch, *, graphdef, optimizer, cfg)` is a pure function; every loss knob
is read from the frozen `Config` (`cfg.algo`, nothing re-declared here); the loss and its
micro-batch accumulation are `train/objective.py`'s. `jit_train_step` jits it with explicit
shardings and a donated state; the trainer and the AOT tool (`dapo_jax/aot`) both use it, and
`abstract_minibatch` is the input the trainer's `prepare` builds, as shapes, for the AOT tool.
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import optax

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.core import loss_modes
from dapo_jax.train import objective
from dapo_jax.train import state as state_lib
from dapo_jax.train.packing import PackPlan
from dapo_jax.train.state import TrainState

TokenStats = objective.TokenStats


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MiniBatch:
  """The update's input: B sequences laid out as rows [prompt][response][pad] of S tokens (row
  n·G + g is response g of prompt n), host numpy or device arrays; immutable.

  The optional log-probs decide how the update treats the batch, statically under jit (a None
  field is part of the pytree's structure): without `old_logp_BxS` the update is on-policy
  (`on_policy`), with `behav_logp_BxS` the off-policy correction (`algo.is_correction`) and the
  sampler-vs-trainer mismatch metrics are computed, `ref_logp_BxS` feeds the KL term.
  `expert_ids_BxSxLxK` (routing replay, `model.routing_replay`) are the sampler's experts of
  every token of the rows the model runs on: `pack`'s packed rows once a plan is set
  (`logprob_pass.with_plans`), else the sequence rows; the update and the log-prob pass route
  each token by them (-1: by the trainer's router).
  """
  tokens_BxS: Any                   # int32
  attn_mask_BxS: Any                # float32: 1 on prompt and response tokens
  loss_mask_BxS: Any                # float32: 1 on the response tokens the loss counts
  adv_B: Any                        # float32: the sequence's advantage
  pack: PackPlan | None = None      # the packed rows the model runs on; None = one per row
  old_logp_BxS: Any = None          # log pi_old at the response tokens (0 elsewhere)
  behav_logp_BxS: Any = None        # the sampler's log-probs, as sampled
  ref_logp_BxS: Any = None          # the reference policy's (algo.kl_coef > 0)
  expert_ids_BxSxLxK: Any = None    # int16 routing replay: experts per token and MoE layer

  @property
  def on_policy(self) -> bool:
    """The old log-probs are the update's own forward's (detached): one update at the params
    that sampled, as TRL's num_iterations = 1."""
    return self.old_logp_BxS is None

  @property
  def num_seqs(self) -> int:
    return self.tokens_BxS.shape[0]

  def rows(self, start: int, stop: int) -> "MiniBatch":
    """Sequences [start, stop) with their plan rows (host arrays: one mini-batch of a step)."""
    return jax.tree.map(lambda x: x[start:stop], self)


def on_policy_update(cfg: Config) -> bool:
  """True when the step's one update runs at the sampling params and needs the recomputed old
  log-probs only inside itself (no off-policy weights, no Clip-/KL-Cov selection before it):
  `prepare` then builds an on-policy MiniBatch and runs no log-prob pass."""
  algo = cfg.algo
  return (cfg.train.num_minibatches == 1 and algo.old_logp_source == "recompute"
          and algo.is_correction == "none" and not loss_modes.MODES[algo.loss_mode].selects)


def abstract_minibatch(cfg: Config, data_sharding, moe_shape=None) -> MiniBatch:
  """The MiniBatch `prepare` builds for one update under `cfg`, as ShapeDtypeStructs.
  moe_shape: (MoE layers, experts per token) of the model, for `model.routing_replay`."""
  b, s, algo = cfg.minibatch_seqs, cfg.seq_len, cfg.algo

  def arr(dtype, *shape):
    return jax.ShapeDtypeStruct((b, *shape), dtype, sharding=data_sharding)

  per_token = lambda on: arr(jnp.float32, s) if on else None  # noqa: E731
  return MiniBatch(
      tokens_BxS=arr(jnp.int32, s), attn_mask_BxS=arr(jnp.float32, s),
      loss_mask_BxS=arr(jnp.float32, s), adv_B=arr(jnp.float32),
      pack=PackPlan(*(arr(jnp.int32, s) for _ in range(4)), micro_B=arr(jnp.int32)),
      old_logp_BxS=per_token(not on_policy_update(cfg)),
      behav_logp_BxS=per_token(algo.is_correction != "none"),
      ref_logp_BxS=per_token(algo.kl_coef > 0),
      expert_ids_BxSxLxK=arr(jnp.int16, s, *moe_shape) if cfg.model.routing_replay else None)


def train_step(state: TrainState, minibatch: MiniBatch, *, graphdef, optimizer, cfg: Config,
               mesh=None) -> tuple[TrainState, dict, TokenStats | None]:
  """One optimizer update -> (state, metrics, the on-policy forward's TokenStats or None).

  A non-finite loss, gradient, update or new parameter leaves params and optimizer untouched
  (skipped, reported as `skipped` = 1): a corrupt optimizer state can never write NaN weights.
  `lr` is the learning rate this update used (cfg.optim's schedule at the count of applied
  updates, which the optimizer shares)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), state.updates)
  loss, grads, aux, tokens = objective.loss_and_grad(state.params, graphdef, minibatch, cfg,
                                                     key=key, mesh=mesh)
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
  return new_state, metrics, tokens


def jit_train_step(cfg: Config, *, graphdef, optimizer, mesh, state_shardings):
  """`train_step` jitted with explicit layouts: the state keeps its (fsdp/tensor) sharding and
  is donated, every mini-batch array is split over the batch axes, metrics come back
  replicated and per-token outputs batch-split."""
  dsh = sharding.data_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  return jax.jit(functools.partial(train_step, graphdef=graphdef, optimizer=optimizer, cfg=cfg,
                                   mesh=mesh),
                 in_shardings=(state_shardings, dsh),
                 out_shardings=(state_shardings, replicated, dsh), donate_argnums=(0,))
