"""Tests of dapo_jax.sharding: meshes, the rules table, sharded model == unsharded model."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from dapo_jax import sharding as S
from dapo_jax.models.sharded import create_sharded_model
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2, token_logprobs

CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, logits_chunk=16)
MESHES = {"(8,)": {"fsdp": 8}, "(2,4)": {"fsdp": 2, "tensor": 4},
          "(2,2,2)": {"data": 2, "fsdp": 2, "tensor": 2}}


def test_make_mesh_sizes_and_errors(cpu_devices):
  mesh = S.make_mesh({"data": 2, "fsdp": -1, "tensor": 2})
  assert dict(mesh.shape) == {"data": 2, "fsdp": 2, "tensor": 2}
  assert S.make_mesh({"data": -1}, devices=cpu_devices[:4]).shape["data"] == 4
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    S.make_mesh({"data": -1, "fsdp": -1})
  with pytest.raises(ValueError, match="need 6 devices, have 8"):
    S.make_mesh({"data": 2, "tensor": 3})
  with pytest.raises(ValueError, match="not divisible"):
    S.make_mesh({"data": 3, "tensor": -1})
  with pytest.raises(ValueError, match="axis 'data' size"):
    S.make_mesh({"data": 0})
  with pytest.raises(ValueError, match="empty"):
    S.make_mesh({})


def test_logical_rules():
  mesh = S.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  spec = lambda names, shape=None: S.logical_to_mesh_sharding(names, mesh, shape=shape).spec
  assert spec(("vocab", "embed")) == P("tensor", "fsdp")
  assert spec(("layers", "embed", "heads", "head_dim")) == P(None, "fsdp", "tensor", None)
  assert spec(("batch",)) == P(("data", "fsdp"))
  # A dimension the mesh axis does not divide is replicated over it.
  assert spec(("kv_heads", "head_dim"), shape=(3, 8)) == P(None, None)
  assert spec(("batch", None), shape=(6, 5)) == P("data", None)
  # A mesh axis is used once per array; axes the mesh lacks are dropped.
  assert spec(("heads", "mlp")) == P("tensor", None)
  tensor_only = S.make_mesh({"tensor": 8})
  assert S.logical_to_mesh_sharding(("embed", "vocab"), tensor_only).spec == P(None, "tensor")
  assert S.data_sharding(mesh).spec == P(("data", "fsdp"))
  with pytest.raises(ValueError, match="'experts' has no entry"):
    spec(("experts",))
  with pytest.raises(ValueError, match="do not match shape"):
    spec(("embed",), shape=(4, 4))


def test_create_sharded_model_matches_eager_init_and_rules():
  mesh = S.make_mesh(MESHES["(2,4)"])
  model = create_sharded_model(CFG, mesh, seed=3)
  eager = Qwen2(CFG, rngs=nnx.Rngs(3))
  state, ref = nnx.state(model), nnx.state(eager)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, atol=1e-6)
  want = S.model_shardings(model, mesh)
  assert all(jax.tree.leaves(jax.tree.map(lambda a, s: a.sharding == s, state, want)))
  assert state["layers"]["wq"].sharding.spec == P(None, "fsdp", "tensor", None)
  # 2 KV heads do not divide the tensor axis of 4: replicated over it, sharded over fsdp.
  assert state["layers"]["wk"].sharding.spec == P(None, "fsdp", None, None)
  # Swapping the table (here: pure FSDP, as a dict) changes the parallelism, not the model.
  fsdp_only = {**dict(S.DEFAULT_RULES), "vocab": None, "heads": None, "kv_heads": None,
               "mlp": None}
  state2 = nnx.state(create_sharded_model(CFG, mesh, rules=fsdp_only, seed=3))
  assert state2["layers"]["wq"].sharding.spec == P(None, "fsdp", None, None)
  assert state2["embed"].sharding.spec == P(None, "fsdp")
  np.testing.assert_array_equal(state2["embed"], state["embed"])


def _fwd_and_logprobs(model, toks, mask):
  logp, ent = token_logprobs(model, toks, mask)
  return model(toks, mask), logp, ent


_fwd_lp = nnx.jit(_fwd_and_logprobs)


@pytest.fixture(scope="module")
def reference():
  model = Qwen2(CFG, rngs=nnx.Rngs(0))
  toks = jnp.asarray(np.random.RandomState(1).randint(0, CFG.vocab_size, (8, 16)), jnp.int32)
  lengths = jnp.array([16, 3, 9, 12, 16, 1, 7, 14])
  mask = (jnp.arange(16)[None] < lengths[:, None]).astype(jnp.int32)
  out = _fwd_lp(model, toks, mask)
  return model, toks, mask, out


@pytest.mark.parametrize("mesh_name", list(MESHES))
def test_sharded_forward_and_logprobs_equal_unsharded(reference, mesh_name):
  model, toks, mask, ref = reference
  mesh = S.make_mesh(MESHES[mesh_name])
  graphdef, state = nnx.split(model)
  state = jax.device_put(state, S.model_shardings(model, mesh))
  toks_s, mask_s = jax.device_put((toks, mask), S.data_sharding(mesh))

  @jax.jit
  def run(state, toks, mask):
    return _fwd_and_logprobs(nnx.merge(graphdef, state), toks, mask)

  out = run(state, toks_s, mask_s)
  for got, want in zip(out, ref):
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_sharded_gradient_and_decode_equal_unsharded(reference):
  model, toks, mask, _ = reference
  mesh = S.make_mesh(MESHES["(2,2,2)"])
  graphdef, state = nnx.split(model)
  shardings = S.model_shardings(model, mesh)

  def loss(state, toks, mask):
    return jnp.sum(token_logprobs(nnx.merge(graphdef, state), toks, mask)[0])

  grad = jax.jit(jax.grad(loss))
  g_ref = grad(state, toks, mask)
  state_s = jax.device_put(state, shardings)
  g = jax.jit(jax.grad(loss), out_shardings=shardings)(
      state_s, *jax.device_put((toks, mask), S.data_sharding(mesh)))
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)

  # Prefill + one decode step on the mesh (cache sharded over slots) vs the full forward.
  prompt_len = jnp.minimum(jnp.sum(mask, axis=1), 15)
  rows = jnp.arange(8)

  def gen(state, toks, lengths):
    m = nnx.merge(graphdef, state)
    _, cache = m.prefill(toks, lengths, cache_len=20)
    return m.decode_step(toks[rows, lengths], lengths, cache)

  full_logits = _fwd_lp(model, toks, jnp.ones_like(mask))[0]
  cache_sh = S.cache_sharding(mesh, (2, 8, 20, 2, 8))
  assert cache_sh.spec == P(None, ("data", "fsdp"), None, "tensor", None)
  logits, cache = jax.jit(gen, out_shardings=(None, {"k": cache_sh, "v": cache_sh}))(
      state_s, *jax.device_put((toks, prompt_len), S.data_sharding(mesh)))
  np.testing.assert_allclose(logits, full_logits[rows, prompt_len], atol=1e-5)
  assert cache["k"].sharding == cache_sh


def test_per_device_parameter_bytes_divide_as_rules_say():
  cfg = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=768, num_layers=4,
                    num_heads=8, num_kv_heads=4, head_dim=32)
  mesh = S.make_mesh({"fsdp": 2, "tensor": 4})
  model = create_sharded_model(cfg, mesh)
  # Hand-derived from DEFAULT_RULES on fsdp=2 x tensor=4: matrices split 8 ways
  # (embed->fsdp, vocab/heads/kv_heads/mlp->tensor), biases 4 ways, norms replicated.
  divisor = {"embed": 8, "lm_head": 8, "final_norm": 1, "attn_norm": 1, "mlp_norm": 1,
             "wq": 8, "wk": 8, "wv": 8, "wo": 8, "bq": 4, "bk": 4, "bv": 4,
             "w_gate": 8, "w_up": 8, "w_down": 8}
  flat = nnx.to_flat_state(nnx.state(model))
  expected = sum(v.get_value().nbytes // divisor[path[-1]] for path, v in flat)
  total = sum(v.get_value().nbytes for _, v in flat)
  per_device = {}
  for leaf in jax.tree.leaves(nnx.state(model)):
    for shard in leaf.addressable_shards:
      per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
  print(f"\nparams {total / 2**20:.2f} MiB; per device (fsdp=2 x tensor=4): "
        + ", ".join(f"{d.id}: {b / 2**20:.3f} MiB" for d, b in sorted(
            per_device.items(), key=lambda kv: kv[0].id)))
  assert total == cfg.num_params * 4
  assert len(per_device) == 8
  assert set(per_device.values()) == {expected}
  assert expected < total / 7
