"""The DAPO maths as pure functions of arrays.

Nothing here imports a model, an optimizer, a mesh or a config: arrays in, arrays (and a dict of
metrics) out. Every function is jittable and shards like any jnp expression.
"""
from dapo_jax.core import advantages, filtering, losses, overlong, stats
from dapo_jax.core._checks import check_array

__all__ = ["advantages", "filtering", "losses", "overlong", "stats", "check_array"]
