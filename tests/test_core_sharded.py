"""Core maths on (8,), (2,4), (2,2,2) CPU meshes equals the unsharded result."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dapo_jax.core import advantages, filtering, losses, overlong, stats

MESHES = {
    "8": ((8,), ("data",)),
    "2x4": ((2, 4), ("data", "tensor")),
    "2x2x2": ((2, 2, 2), ("data", "fsdp", "tensor")),
}


def _mesh(name):
  shape, axes = MESHES[name]
  return Mesh(np.asarray(jax.devices()).reshape(shape), axes)


def _batch_spec(mesh):
  batch_axes = tuple(a for a in mesh.axis_names if a in ("data", "fsdp"))
  return P(batch_axes)


def _inputs(B=32, T=24, seed=0):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1, 0.5, (B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.3, (B, T))).astype(np.float32)
  rewards = rng.choice([-1.0, 1.0], size=(B // 4, 4)).astype(np.float32)
  lengths = rng.integers(1, T + 1, B)
  mask = (np.arange(T)[None] < lengths[:, None]).astype(np.float32)
  return logp, old, rewards, mask, lengths


def _pipeline(logp, old, rewards, mask, lengths, *, agg, clip_c):
  """advantages -> overlong shaping -> loss and its gradient, as one jitted program would."""
  shaped = rewards + overlong.soft_overlong_penalty(lengths, max_len=20, cache_len=8).reshape(
      rewards.shape)
  adv = advantages.group_advantages(shaped).reshape(-1)
  keep = jnp.repeat(filtering.mixed_groups(rewards > 0), rewards.shape[1])
  m = mask * keep[:, None].astype(mask.dtype)
  fn = lambda lp: losses.policy_loss(lp, old, adv, m, agg=agg, clip_c=clip_c)
  (loss, aux), grad = jax.value_and_grad(fn, has_aux=True)(logp)
  return loss, aux, grad, stats.masked_mean(-logp, m)


@pytest.mark.parametrize("mesh_name", list(MESHES))
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_sharded_equals_unsharded(cpu_devices, mesh_name, agg):
  del cpu_devices
  logp, old, rewards, mask, lengths = _inputs()
  fn = functools.partial(_pipeline, agg=agg, clip_c=3.0)
  want = jax.jit(fn)(logp, old, rewards, mask, lengths)
  mesh = _mesh(mesh_name)
  spec = _batch_spec(mesh)
  shard = lambda x: jax.device_put(x, NamedSharding(mesh, spec))
  args = [shard(x) for x in (logp, old, rewards, mask, lengths)]
  assert len(args[0].sharding.device_set) > 1
  got = jax.jit(fn)(*args)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
