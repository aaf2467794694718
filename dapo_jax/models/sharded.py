"""A policy initialised straight into its shardings (the logical-axis rules of dapo_jax.sharding)."""
import functools
from typing import Mapping

import jax
from flax import nnx
from jax.sharding import Mesh

from dapo_jax import sharding
from dapo_jax.models.qwen2 import Qwen2


def create_sharded_model(cfg, mesh: Mesh, *, rules=sharding.DEFAULT_RULES, seed: int = 0):
  """Initialises a Qwen2 directly into its shardings: no unsharded copy ever exists."""
  graphdef, init = _sharded_init(cfg, mesh, _freeze(rules))
  return nnx.merge(graphdef, init(jax.random.key(seed)))


def _freeze(rules):
  """Rules as a hashable tuple of (name, axis or tuple of axes) pairs."""
  items = rules.items() if isinstance(rules, Mapping) else rules
  return tuple((name, tuple(ax) if isinstance(ax, list) else ax) for name, ax in items)


@functools.lru_cache(maxsize=16)
def _sharded_init(cfg, mesh, rules):
  """(graphdef, jitted key -> sharded state), cached so repeated calls do not recompile."""
  abstract = nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))
  shardings = sharding.model_shardings(abstract, mesh, rules)
  init = jax.jit(lambda key: nnx.state(Qwen2(cfg, rngs=nnx.Rngs(key))),
                 out_shardings=shardings)
  return nnx.graphdef(abstract), init
