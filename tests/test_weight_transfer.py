"""Trainer -> sampler weights move device-to-device in the sampler's dtype, equal to the old
host round trip (device_get, cast, device_put)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import sharding
from dapo_jax.models import sharded
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout.sampler import make_sampler
from dapo_jax.rollout.transfer import transfer_params

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=8, dtype="bfloat16", param_dtype="float32")


def _trainer_params(seed=0):
  mesh = sharding.make_mesh({"data": 2, "fsdp": 4, "tensor": 1})
  return nnx.state(sharded.create_sharded_model(CFG, mesh, seed=seed), nnx.Param)


def test_transfer_equals_host_path(cpu_devices):
  params = _trainer_params()
  smesh = sharding.make_mesh({"data": 4, "fsdp": 1, "tensor": 2}, cpu_devices)
  model = nnx.eval_shape(lambda: Qwen2(CFG, rngs=nnx.Rngs(0)))
  shardings = nnx.filter_state(sharding.model_shardings(model, smesh), nnx.Param)
  got = transfer_params(params, shardings, jnp.bfloat16)
  host = jax.tree.map(lambda x: np.asarray(jax.device_get(x)).astype(jnp.bfloat16), params)
  want = jax.device_put(host, shardings)
  for g, w, s in zip(jax.tree.leaves(got), jax.tree.leaves(want), jax.tree.leaves(shardings)):
    assert g.dtype == jnp.bfloat16 and g.sharding == s
    np.testing.assert_array_equal(np.asarray(g), np.asarray(w))


def test_sampler_holds_compute_dtype_and_frees_old_copy(cpu_devices):
  params = _trainer_params()
  graphdef = nnx.graphdef(nnx.eval_shape(lambda: Qwen2(CFG, rngs=nnx.Rngs(0))))
  s = make_sampler(nnx.merge(graphdef, params), num_slots=8, max_prompt_len=8, max_len=16,
                   mesh=sharding.make_mesh({"data": 4, "fsdp": 1, "tensor": 2}, cpu_devices))
  old = jax.tree.leaves(s.engine.params)
  assert all(x.dtype == jnp.bfloat16 for x in old)
  new = _trainer_params(seed=1)
  s.update_params(new)
  assert all(x.is_deleted() for x in old)  # freed before the new copy was made
  first = jax.tree.leaves(s.engine.params)[0]
  np.testing.assert_array_equal(np.asarray(first),
                                np.asarray(jax.tree.leaves(new)[0]).astype(jnp.bfloat16))
  assert not any(x.is_deleted() for x in jax.tree.leaves(new))  # the trainer's stay intact
  with pytest.raises(ValueError, match="shape"):
    s.update_params(jax.tree.map(lambda x: x[:1], new))
