"""Train state and the optimizer (AdamW, linear warm-up, weight decay, global-norm clip)."""
import flax
import jax
import jax.numpy as jnp
import optax


@flax.struct.dataclass
class TrainState:
  """Everything the jitted update reads and writes. `updates` counts applied optimizer updates."""
  updates: jax.Array
  params: object
  opt_state: object


def lr_schedule(*, lr: float, warmup_updates: int):
  """Linear warm-up from 0 to lr over `warmup_updates` optimizer updates, then constant."""
  if warmup_updates <= 0:
    return optax.constant_schedule(lr)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup_updates), optax.constant_schedule(lr)],
      [warmup_updates])


def make_optimizer(*, lr: float, warmup_updates: int, weight_decay: float, grad_clip: float,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
  """AdamW with decay on every parameter (as the reference's FSDP AdamW), clipped first."""
  chain = []
  if grad_clip > 0:
    chain.append(optax.clip_by_global_norm(grad_clip))
  chain.append(optax.adamw(lr_schedule(lr=lr, warmup_updates=warmup_updates), b1=b1, b2=b2,
                           eps=eps, weight_decay=weight_decay))
  return optax.chain(*chain)


def create(params, optimizer) -> TrainState:
  return TrainState(updates=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(params))


def shardings(params, optimizer, replicated) -> TrainState:
  """Shardings of `create(params)`: params keep theirs, the optimizer's per-parameter state
  (Adam's mu and nu) follows its parameter, counters are `replicated`. Without them jit(create)
  replicates mu and nu on every chip (~262 GB at 32B: the AOT check's first catch)."""
  psh = jax.tree.map(lambda x: x.sharding, params)
  abstract = jax.eval_shape(lambda p: create(p, optimizer), params)
  opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract.opt_state, psh,
                              transform_non_params=lambda _: replicated)
  return TrainState(updates=replicated, params=psh, opt_state=opt)
