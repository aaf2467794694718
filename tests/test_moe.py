"""Qwen3-MoE in dapo_jax: routing by hand, grouped == dense experts (values and gradients),
routing replay, the load-balancing loss, sharded == unsharded, decode == full forward."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import sharding
from dapo_jax.models import moe
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2, routed_token_logprobs

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=False, qk_norm=True,
                  architecture="qwen3_moe", num_experts=6, num_experts_per_tok=2,
                  moe_intermediate_size=16, norm_topk_prob=True)


def _model(cfg=CFG, seed=0, scale=4.0):
  """Weights scaled up so routing and next tokens depend clearly on the input."""
  m = Qwen2(cfg, rngs=nnx.Rngs(seed))
  nnx.update(m, jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x,
                             nnx.state(m, nnx.Param)))
  return m


def _batch(b=3, t=10, seed=1):
  rng = np.random.default_rng(seed)
  toks = jnp.asarray(rng.integers(0, CFG.vocab_size, (b, t)), jnp.int32)
  lengths = np.array([t, 7, 4])[:b]
  mask = jnp.asarray(np.arange(t)[None] < lengths[:, None], jnp.int32)
  return toks, mask


# ----- routing and experts, by hand ------------------------------------------------------
def test_route_by_hand():
  x = jnp.eye(3, 4, dtype=jnp.float32)            # token i picks router row i
  w = jnp.asarray([[2.0, 1.0, 0.0, -1.0], [0.0, 0.0, 3.0, 0.0], [1.0, 1.0, 1.0, 1.0],
                   [0.0, 0.0, 0.0, 0.0]])       # [D=4, E=4]
  ids, gates, p = moe.route(x, w, k=2, norm_topk_prob=False)
  want_p = np.exp(w[:3]) / np.exp(w[:3]).sum(-1, keepdims=True)
  np.testing.assert_allclose(p, want_p, rtol=1e-6)
  np.testing.assert_array_equal(ids[:2], [[0, 1], [2, 0]])
  np.testing.assert_allclose(gates[0], want_p[0, :2], rtol=1e-6)
  _, normed, _ = moe.route(x, w, k=2, norm_topk_prob=True)
  np.testing.assert_allclose(normed[0], want_p[0, :2] / want_p[0, :2].sum(), rtol=1e-6)
  # replay: given ids route the token, gates are this router's probabilities there; -1 = own
  replay = jnp.asarray([[3, 2], [-1, -1], [1, 0]])
  r_ids, r_gates, _ = moe.route(x, w, k=2, norm_topk_prob=True, replay_NxK=replay)
  np.testing.assert_array_equal(r_ids, [[3, 2], [2, 0], [1, 0]])
  np.testing.assert_allclose(r_gates[0], want_p[0, [3, 2]] / want_p[0, [3, 2]].sum(), rtol=1e-6)


def _expert_inputs(n=40, d=8, f=6, e=5, k=2, seed=0):
  ks = jax.random.split(jax.random.key(seed), 6)
  x = jax.random.normal(ks[0], (n, d))
  ids = jax.random.randint(ks[1], (n, k), 0, e - 1)   # expert e-1 gets no token
  ids = ids.at[:, 1].set((ids[:, 0] + 1) % (e - 1))   # distinct experts per token
  w = jax.nn.softmax(jax.random.normal(ks[2], (n, k)))
  ws = [jax.random.normal(kk, s) * 0.5 for kk, s in zip(ks[3:], ((e, d, f), (e, d, f), (e, f, d)))]
  return x, ids, w, ws


def test_dense_reference_by_hand():
  x, ids, w, (g, u, dn) = _expert_inputs()
  y = moe.experts_dense(x, ids, w, g, u, dn)
  want = np.zeros(x.shape, np.float32)
  for n in range(x.shape[0]):
    for j in range(ids.shape[1]):
      e = int(ids[n, j])
      want[n] += float(w[n, j]) * np.asarray(
          (jax.nn.silu(x[n] @ g[e]) * (x[n] @ u[e])) @ dn[e])
  np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_grouped_equals_dense_values_and_gradients():
  x, ids, w, ws = _expert_inputs()

  def loss(fn):
    return lambda x, w, *ws: jnp.sum(jnp.sin(fn(x, ids, w, *ws)))

  a = moe.experts_grouped(x, ids, w, *ws)
  b = moe.experts_dense(x, ids, w, *ws)
  np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
  ga = jax.grad(loss(moe.experts_grouped), argnums=(0, 1, 2, 3, 4))(x, w, *ws)
  gb = jax.grad(loss(moe.experts_dense), argnums=(0, 1, 2, 3, 4))(x, w, *ws)
  for p, q in zip(ga, gb):
    np.testing.assert_allclose(p, q, rtol=1e-4, atol=1e-5)
  assert float(jnp.abs(ga[2][-1]).max()) == 0.0  # the idle expert gets no gradient


def test_load_balancing_loss_by_hand():
  # uniform probabilities and a perfectly even load: E * sum_e (k/E)(1/E) = k
  e, k, n = 4, 2, 8
  load = jnp.full((3, e), n * k / e)
  prob = jnp.full((3, e), n / e)
  assert float(moe.load_balancing_loss(load, prob, n)) == pytest.approx(k)
  # all load on expert 0 with all probability on it: E * k * 1 = 8
  load = jnp.zeros((1, e)).at[0, 0].set(n * k)
  prob = jnp.zeros((1, e)).at[0, 0].set(n)
  assert float(moe.load_balancing_loss(load, prob, n)) == pytest.approx(e * k)


# ----- the model -------------------------------------------------------------------------
def test_config_layers_params_and_errors():
  cfg = dataclasses.replace(CFG, mlp_only_layers=(1,))
  assert cfg.moe_layers == (0, 2) and cfg.dense_layers == (1,) and cfg.mixed_layers
  assert dataclasses.replace(CFG, decoder_sparse_step=2).moe_layers == (1,)
  for c in (CFG, cfg):
    state = nnx.state(nnx.eval_shape(lambda c=c: Qwen2(c, rngs=nnx.Rngs(0))))
    assert sum(x.size for x in jax.tree.leaves(state)) == c.num_params
  assert CFG.num_params - CFG.num_active_params == 3 * 4 * 3 * 32 * 16  # 4 idle experts x 3
  for field, value, match in (("num_experts_per_tok", 7, "<= num_experts"),
                              ("mlp_only_layers", (3,), "mlp_only_layers"),
                              ("moe_impl", "megablox", "moe_impl"),
                              ("architecture", "qwen3", "need architecture='qwen3_moe'")):
    with pytest.raises(ValueError, match=match):
      dataclasses.replace(CFG, **{field: value})
  assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg


_routed = nnx.jit(lambda m, t, k, ids: routed_token_logprobs(m, t, k, expert_ids_LxBxTxK=ids))


@pytest.mark.parametrize("mlp_only", [(), (1,)])
def test_replay_of_own_routing_is_exact_and_of_another_model_differs(mlp_only):
  cfg = dataclasses.replace(CFG, mlp_only_layers=mlp_only)
  model, other = _model(cfg), _model(cfg, seed=7)
  toks, mask = _batch()
  logp, _, routing = _routed(model, toks, mask, None)
  ids = routing.expert_ids_LxBxTxK
  assert ids.shape == (len(cfg.moe_layers), 3, 10, 2)
  replayed, _, r2 = _routed(model, toks, mask, ids)
  np.testing.assert_array_equal(np.asarray(replayed), np.asarray(logp))  # bit-exact
  np.testing.assert_array_equal(np.asarray(r2.expert_ids_LxBxTxK), np.asarray(ids))
  foreign = _routed(other, toks, mask, None)[2].expert_ids_LxBxTxK
  assert float(jnp.mean(jnp.any(foreign != ids, axis=-1))) > 0.3  # the models route apart
  moved, _, r3 = _routed(model, toks, mask, foreign)
  np.testing.assert_array_equal(np.asarray(r3.expert_ids_LxBxTxK), np.asarray(foreign))
  assert float(jnp.max(jnp.abs(moved - logp) * mask)) > 1e-3


def test_router_gets_gradients_under_replay():
  model, other = _model(), _model(seed=7)
  toks, mask = _batch()
  foreign = _routed(other, toks, mask, None)[2].expert_ids_LxBxTxK
  graphdef, params = nnx.split(model, nnx.Param)

  def loss(p):
    m = nnx.merge(graphdef, p)
    return jnp.sum(routed_token_logprobs(m, toks, mask, expert_ids_LxBxTxK=foreign)[0])

  g = jax.jit(jax.grad(loss))(params)["layers"]["router"].get_value()
  assert g.shape == (3, 32, 6) and bool(jnp.all(jnp.isfinite(g)))
  assert float(jnp.min(jnp.abs(g).sum(axis=(1, 2)))) > 0  # every MoE layer's router


_fwd = nnx.jit(lambda m, t, k: routed_token_logprobs(m, t, k)[0])


def test_sharded_grouped_equals_unsharded():
  """The grouped experts under shard_map (mesh given) equal the single-device path."""
  model = _model()
  toks = jax.random.randint(jax.random.key(3), (4, 10), 0, CFG.vocab_size)
  mask = jnp.ones((4, 10), jnp.int32)
  want = _fwd(model, toks, mask)
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])
  graphdef, state = nnx.split(model)
  sh = sharding.model_shardings(model, mesh)
  state = jax.device_put(state, sh)
  dsh = sharding.data_sharding(mesh)

  def f(st, t, k):
    return jnp.sum(routed_token_logprobs(nnx.merge(graphdef, st), t, k, mesh=mesh)[0])

  got, grads = jax.jit(jax.value_and_grad(f))(state, jax.device_put(toks, dsh),
                                               jax.device_put(mask, dsh))
  assert float(got) == pytest.approx(float(jnp.sum(want)), rel=1e-5)
  want_g = jax.grad(lambda st: jnp.sum(routed_token_logprobs(
      nnx.merge(graphdef, st), toks, mask)[0]))(jax.device_get(state))
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(want_g)):  # f32 summation order
    assert float(jnp.max(jnp.abs(a - b))) <= 2e-3 * float(jnp.max(jnp.abs(b))) + 1e-6
  assert sh["layers"]["we_gate"].get_value().spec[1] is not None  # experts split on the mesh


_logits = nnx.jit(lambda m, t, k: m(t, k))
_prefill = nnx.jit(lambda m, t, n, ids: m.prefill_routed(t, n, cache_len=24,
                                                         expert_ids_LxBxTxK=ids))
_decode = nnx.jit(lambda m, t, p, c, ids: m.decode_step_routed(t, p, c, expert_ids_LxBxK=ids))


@pytest.mark.parametrize("mlp_only,split", [((), False), ((1,), False), ((1,), True)])
def test_decode_routing_equals_full_forward(mlp_only, split):
  """Prefill + decode steps give the full forward's logits and expert ids, stacked or per-layer
  cache; replaying the ids leaves them unchanged."""
  from dapo_jax.models.qwen2 import split_cache
  cfg = dataclasses.replace(CFG, mlp_only_layers=mlp_only)
  model = _model(cfg)
  toks, mask = _batch(t=12)
  lengths = jnp.asarray([6, 5, 4])
  _, _, routing = _routed(model, toks, jnp.ones_like(mask), None)
  ids = routing.expert_ids_LxBxTxK
  logits, cache, p_ids = _prefill(model, toks[:, :6], lengths, None)
  np.testing.assert_array_equal(p_ids[:, 0, :6], ids[:, 0, :6])
  if split:
    ks, vs = split_cache(cache)
    cache = {"k": tuple(ks), "v": tuple(vs)}
  pos = lengths
  for _ in range(3):
    tok = toks[jnp.arange(3), pos]
    rows = jnp.arange(3)
    logits, cache, d_ids = _decode(model, tok, pos, cache, None)
    want = jnp.stack([ids[:, b, pos[b]] for b in range(3)], axis=1)
    np.testing.assert_array_equal(d_ids, want)
    full = _logits(model, toks, (jnp.arange(12)[None] <= pos[:, None]).astype(jnp.int32))
    np.testing.assert_allclose(logits, full[rows, pos], atol=1e-4)
    replayed = _decode(model, tok, pos, cache, d_ids)[2]
    np.testing.assert_array_equal(replayed, d_ids)
    pos = pos + 1


def test_run_config_builds_a_moe_model():
  """configs/tiny_moe_cpu.py's expert fields reach the model (source="config"); bad ones are
  refused naming the field."""
  from configs import tiny_moe_cpu
  from dapo_jax import config as config_lib
  from dapo_jax.train import setup
  c = tiny_moe_cpu.get_config("init=True")
  mcfg = setup.model_config(config_lib.parse(c), 100)
  assert (mcfg.architecture, mcfg.num_experts, mcfg.num_experts_per_tok, mcfg.qk_norm,
          mcfg.attention_bias, mcfg.moe_impl) == ("qwen3_moe", 4, 2, True, False, "dense")
  assert mcfg.moe_layers == tuple(range(mcfg.num_layers))
  c.model.num_experts_per_tok = 5
  with pytest.raises(ValueError, match="config.model.num_experts_per_tok: 5 experts per token"):
    config_lib.parse(c)
  c.model.moe_impl = "megablox"
  with pytest.raises(ValueError, match="config.model.moe_impl"):
    config_lib.parse(c)
