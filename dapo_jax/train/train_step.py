"""The update: one optimizer step (`train_step`) on a `MiniBatch` (train/batch.py), and its jit.

`train_step(state, minibatch, *, graphdef, optimizer, cfg)` is a pure function; every loss knob
is read from the frozen `Config` (`cfg.algo`, nothing re-declared here); the loss and its
micro-batch accumulation are `train/objective.py`'s. `jit_train_step` jits it with explicit
shardings and a donated state; the trainer and the AOT tool (`dapo_jax/aot`) both use it, the
AOT tool on `batch.abstract_minibatch`, the input the trainer's `prepare` builds, as shapes.
"""
import functools

import jax
import jax.numpy as jnp
import optax

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.models import lora
from dapo_jax.train import objective
from dapo_jax.train import state as state_lib
from dapo_jax.train.batch import MiniBatch, TokenStats
from dapo_jax.train.state import TrainState


def train_step(state: TrainState, minibatch: MiniBatch, frozen=None, *, graphdef, optimizer,
               cfg: Config, mesh=None) -> tuple[TrainState, dict, TokenStats | None]:
  """One optimizer update -> (state, metrics, the on-policy forward's TokenStats or None).

  A non-finite loss, gradient, update or new parameter leaves params and optimizer untouched
  (skipped, reported as `skipped` = 1): a corrupt optimizer state can never write NaN weights.
  `lr` is the learning rate this update used (cfg.optim's schedule at the count of applied
  updates, which the optimizer shares). Under LoRA `state.params` are the adapters and `frozen`
  the base weights they adapt (read, never updated: models/lora.py)."""
  key = jax.random.fold_in(jax.random.PRNGKey(cfg.seed), state.updates)
  loss, grads, aux, tokens = objective.loss_and_grad(lora.join(state.params, frozen), graphdef,
                                                     minibatch, cfg, key=key, mesh=mesh)
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


def jit_train_step(cfg: Config, *, graphdef, optimizer, mesh, state_shardings,
                   frozen_shardings=None):
  """`train_step` jitted with explicit layouts: the state keeps its (fsdp/tensor) sharding and
  is donated, every mini-batch array is split over the batch axes, metrics come back
  replicated and per-token outputs batch-split. With `frozen_shardings` (LoRA) it takes the
  frozen base as a third argument, in those shardings, not donated."""
  dsh = sharding.data_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  extra = () if frozen_shardings is None else (frozen_shardings,)
  return jax.jit(functools.partial(train_step, graphdef=graphdef, optimizer=optimizer, cfg=cfg,
                                   mesh=mesh),
                 in_shardings=(state_shardings, dsh, *extra),
                 out_shardings=(state_shardings, replicated, dsh), donate_argnums=(0,))
