"""Context parallelism (`mesh.context`): each row's tokens split over the mesh's context axis.

On 8 CPU devices the log-probs, entropies, loss and gradients with context 2 and 4 equal those
without a mesh (1e-5 relative, float32), on packed rows holding several segments each; the
offset form of the blocked attention equals a slice of the whole rows'; a context-1 config
builds the mesh it always did; bad settings are refused naming the field. (The splash kernel
per context shard is in test_attention_kernels.py.) A trainer with context 2 logs the losses
of one without, within 1e-4. The update frees the sampler's weights (a memory item beside context
parallelism on small chips) only where nothing samples during it.
"""
import dataclasses
import functools
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import config as config_lib
from dapo_jax import distributed
from dapo_jax import sharding
from dapo_jax.models import attention_blocked
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.train import packing, placement
from dapo_jax.train.objective import logprobs
from dapo_jax.train.train_step import train_step
from tests.test_train_step import _batch, _cfg, _setup
from tests.test_trainer import _records, _run, fake_rewards, tiny_config  # noqa: F401

MCFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                   num_heads=4, num_kv_heads=2, head_dim=8, logits_chunk=32, attention_chunk=4)
B, T = 4, 16
MESHES = {2: {"data": 1, "fsdp": 2, sharding.CONTEXT: 2, "tensor": 2},
          4: {"data": 2, "fsdp": 1, sharding.CONTEXT: 4, "tensor": 1}}


def _close(got, want, rtol=1e-5):
  """Every leaf within rtol of the largest |value| of its reference leaf."""
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * max(np.max(np.abs(b)), 1e-12))


def _packed_rows():
  """Rows of three segments each (per-segment positions), the last rows ending in padding."""
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, MCFG.vocab_size, (B, T)).astype(np.int32)
  seg, pos = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  for b in range(B):
    bounds = [0, *sorted(rng.choice(np.arange(2, T - 2), 2, replace=False)), T - b]
    for i in range(3):
      seg[b, bounds[i]:bounds[i + 1]] = i + 1
      pos[b, bounds[i]:bounds[i + 1]] = np.arange(bounds[i + 1] - bounds[i])
  return tokens, seg, pos


def _objective(graphdef, tokens, seg, pos, mesh):
  def loss(params):
    lp, ent, _ = logprobs(graphdef, params, tokens, seg > 0, positions_BxS=pos,
                          segment_ids_BxS=seg, mesh=mesh)
    weights = np.linspace(0.1, 1.0, T, dtype=np.float32)[None]
    return jnp.sum(lp * weights) + 0.1 * jnp.sum(ent), (lp, ent)
  return jax.jit(jax.value_and_grad(loss, has_aux=True))


@pytest.mark.parametrize("context", [2, 4])
def test_logprobs_and_gradients_equal_without_context(cpu_devices, context):
  tokens, seg, pos = _packed_rows()
  graphdef, params = nnx.split(Qwen2(MCFG, rngs=nnx.Rngs(0)))
  (want, (lp0, ent0)), g0 = _objective(graphdef, tokens, seg, pos, None)(params)
  mesh = sharding.make_mesh(MESHES[context], cpu_devices)
  sharded = jax.device_put(params, sharding.model_shardings(nnx.merge(graphdef, params), mesh))
  assert sharded["embed"].get_value().sharding.spec[1] == ("fsdp", sharding.CONTEXT)
  (got, (lp, ent)), g = _objective(graphdef, tokens, seg, pos, mesh)(sharded)
  assert float(got) == pytest.approx(float(want), rel=1e-5)
  _close((lp, ent), (lp0, ent0))
  _close(g, g0)


def test_moe_logprobs_and_gradients_equal_without_context(cpu_devices):
  """A Qwen3-MoE policy with context 2: its experts' dispatch takes the tokens whole over the
  context axis first (moe.py), and the results equal the unsharded model's."""
  mcfg = dataclasses.replace(MCFG, architecture="qwen3_moe", num_experts=4,
                             num_experts_per_tok=2, moe_intermediate_size=16)
  tokens, seg, pos = _packed_rows()
  graphdef, params = nnx.split(Qwen2(mcfg, rngs=nnx.Rngs(0)))
  (_, (lp0, ent0)), g0 = _objective(graphdef, tokens, seg, pos, None)(params)
  mesh = sharding.make_mesh(MESHES[2], cpu_devices)
  sharded = jax.device_put(params, sharding.model_shardings(nnx.merge(graphdef, params), mesh))
  (_, (lp, ent)), g = _objective(graphdef, tokens, seg, pos, mesh)(sharded)
  _close((lp, ent), (lp0, ent0))
  _close(g, g0)


@pytest.mark.parametrize("offset", [0, 4, 8])
def test_offset_attention_equals_a_slice_of_the_whole_rows(offset):
  """Queries [offset, offset + 8) of 16 against all 16 keys (two segments): values and the
  gradients of q, k and v equal the whole rows' attention at those queries."""
  ks = jax.random.split(jax.random.key(1), 4)
  q = jax.random.normal(ks[0], (2, 16, 4, 8))
  k, v = (jax.random.normal(x, (2, 16, 2, 8)) for x in ks[1:3])
  seg = jnp.asarray(np.repeat([[1] * 6 + [2] * 10], 2, axis=0), jnp.int32)
  w = jax.random.normal(ks[3], (2, 8, 4, 8))
  whole = lambda q, k, v: jnp.sum(  # noqa: E731
      attention_blocked.blocked_attend(q, k, v, seg, seg, 4)[:, offset:offset + 8] * w)
  part = lambda q, k, v: jnp.sum(attention_blocked.offset_attend(  # noqa: E731
      q[:, offset:offset + 8], k, v, seg[:, offset:offset + 8], seg, offset, 4) * w)
  want = jax.value_and_grad(whole, argnums=(0, 1, 2))(q, k, v)
  got = jax.jit(jax.value_and_grad(part, argnums=(0, 1, 2)))(q, k, v)
  _close(got, want)


def test_train_step_equals_without_context(cpu_devices):
  """One packed, micro-batched update with context 2: loss, metrics and new parameters equal
  the update without a mesh (the token-level loss's (sum, count) exact across the shards)."""
  cfg = _cfg(micro_batch_size=8)
  batch = _batch(seed=2)
  batch = dataclasses.replace(batch, pack=packing.pack(batch.tokens_BxS, batch.attn_mask_BxS,
                                                       micro_batches=cfg.micro_batches))
  graphdef, state, opt = _setup(cfg=cfg)
  step = lambda mesh: jax.jit(functools.partial(  # noqa: E731
      train_step, graphdef=graphdef, optimizer=opt, cfg=cfg, mesh=mesh))
  want, m_want, _ = step(None)(state, batch)
  mesh = sharding.make_mesh(MESHES[2], cpu_devices)
  shardings = sharding.model_shardings(nnx.merge(graphdef, state.params), mesh)
  graphdef, state, opt = _setup(cfg=cfg)
  state = state.replace(params=jax.device_put(state.params, shardings))
  got, m_got, _ = step(mesh)(state, jax.device_put(batch, sharding.data_sharding(mesh)))
  _close(got.params, want.params)
  for key in ("loss", "pg_loss", "grad_norm", "clipfrac", "approx_kl", "entropy"):
    if key in m_want:
      assert float(m_got[key]) == pytest.approx(float(m_want[key]), rel=1e-5, abs=1e-7), key


def _config(**mesh):
  c = importlib.import_module("configs.tiny_cpu").get_config()
  c.mesh.update(mesh)
  return c


def test_the_config_check_names_the_impls_attention_runs_context_parallel():
  from dapo_jax.config import checks  # pylint: disable=import-outside-toplevel
  from dapo_jax.models import attention  # pylint: disable=import-outside-toplevel
  assert checks.CONTEXT_ATTENTION_IMPLS == attention.CONTEXT_IMPLS


def test_mesh_has_a_context_axis_only_when_asked(cpu_devices):
  plain = placement.build_mesh(config_lib.parse(_config()), cpu_devices)
  assert sharding.CONTEXT not in plain.shape  # context 1: the mesh of every earlier run
  mesh = placement.build_mesh(config_lib.parse(_config(context=2, tensor=2)), cpu_devices)
  assert dict(mesh.shape) == {"data": 2, "fsdp": 1, sharding.CONTEXT: 2, "tensor": 2}


@pytest.mark.parametrize("mesh, match", [
    (dict(context=0), "mesh.context: must be an int >= 1"),
    (dict(context=3), "mesh.context: 3 must divide the rows' length"),
])
def test_bad_context_settings_are_refused(mesh, match):
  with pytest.raises(ValueError, match=match):
    config_lib.parse(_config(**mesh))


def test_gpu_flash_with_context_is_refused():
  c = _config(context=2)
  c.model.attention_impl = "gpu_flash"
  with pytest.raises(ValueError, match="mesh.context: context parallelism runs the blocked"):
    config_lib.parse(c)


def test_a_single_process_gets_the_cpu_devices_its_mesh_names(monkeypatch):
  cfg = config_lib.parse(_config(context=2, tensor=2))
  calls = []
  monkeypatch.setattr(jax.config, "update", lambda name, value: calls.append((name, value)))
  monkeypatch.setenv("XLA_FLAGS", "")
  assert distributed.cpu_devices_for_mesh(cfg) == 4
  assert calls == [("jax_num_cpu_devices", 4)]
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  assert distributed.cpu_devices_for_mesh(cfg) is None  # the user's count stands
  assert distributed.cpu_devices_for_mesh(config_lib.parse(_config())) is None


def test_trainer_with_context_logs_the_losses_of_one_without(tmp_path):
  """Two steps with mesh.context = 2 (data 4 x context 2) and 1 (data 8): the same rollouts
  (the sampler's mesh is the same), and every update's loss and gradient norm within 1e-4."""
  logs = {}
  for context in (1, 2):
    _run(tiny_config(**{"mesh.context": context}), tmp_path / str(context))
    logs[context] = _records(tmp_path / str(context))
  assert len(logs[1]) == len(logs[2]) == 2
  for a, b in zip(logs[1], logs[2]):
    assert a["accuracy"] == b["accuracy"]  # the same rollouts
    for key in ("loss", "pg_loss", "grad_norm", "entropy"):
      assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-6), key


@pytest.mark.parametrize("placement_, staleness, freed", [
    ("colocated", 0, True), ("colocated", 1, False), ("split", 0, False)])
def test_the_update_frees_the_sampler_weights_only_where_nothing_samples(placement_, staleness,
                                                                         freed):
  cfg = config_lib.parse(_config())
  cfg = dataclasses.replace(cfg, rollout=dataclasses.replace(
      cfg.rollout, placement=placement_, max_staleness=staleness))
  assert placement.frees_sampler_weights(cfg) is freed
