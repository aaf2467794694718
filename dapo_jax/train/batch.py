"""The update's input and outputs as types: `MiniBatch` (the rows one optimizer update trains
on), `TokenStats` (an on-policy update's per-token outputs), `on_policy_update` (whether a
step's one update makes its own old log-probs) and `abstract_minibatch` (the MiniBatch the
trainer's `prepare` builds, as shapes, for the AOT tool). Host-side layout code
(`train/groups.py`) builds these without importing the update's maths.
"""
import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from dapo_jax.config import Config
from dapo_jax.core import loss_modes
from dapo_jax.train.packing import PackPlan


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenStats:
  """Per-token outputs of an on-policy update's forward ([B, S], 0 off the sequences)."""
  logp_BxS: Any
  entropy_BxS: Any


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
          and not algo.corrects_off_policy() and not loss_modes.MODES[algo.loss_mode].selects)


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
      behav_logp_BxS=per_token(algo.corrects_off_policy()),
      ref_logp_BxS=per_token(algo.kl_coef > 0),
      expert_ids_BxSxLxK=arr(jnp.int16, s, *moe_shape) if cfg.model.routing_replay else None)
