"""LoRA adapters (models/lora.py): a fresh adapter changes nothing, the adapted forward equals
the merged weights', the adapters' gradients are the chain rule through the merged weight, an
engine decodes with adapters as with merged weights, and what LoRA refuses."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import config as config_lib
from dapo_jax.config import lora_checks
from dapo_jax.models import lora
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout.engine import Engine
from tests.test_moe import CFG as MOE_CFG
from tests.test_rollout_engine import MAX_LEN, P_LEN, SLOTS, _padded
from tests.test_trainer import tiny_dict

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, dtype="float32",
                  param_dtype="float32")
ALL = ",".join(lora.TARGETS)
TOKENS = jnp.arange(14).reshape(2, 7) % 64
MASK = jnp.ones((2, 7), jnp.int32)


def _adapted(rank=4, targets=ALL, seed=0, cfg=CFG):
  model = Qwen2(cfg, rngs=nnx.Rngs(seed))
  lora.attach(model, rank=rank, alpha=8.0, targets=targets, seed=1)
  return model


def _nudged(model, scale=0.05):
  """`model` with every adapter factor moved off its initial value (B off zero)."""
  graphdef, adapters, frozen = lora.split(model)
  keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(adapters))))
  adapters = jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape), adapters)
  return lora.merge(graphdef, (adapters, frozen))


def test_fresh_adapters_leave_the_policy_unchanged():
  plain = Qwen2(CFG, rngs=nnx.Rngs(0))
  model = _adapted()
  np.testing.assert_array_equal(np.asarray(model(TOKENS, MASK)), np.asarray(plain(TOKENS, MASK)))
  _, adapters, frozen = lora.split(model)
  names = set(adapters["layers"])
  assert names == {f"lora_{f}_{w}" for f in "ab" for w, _ in lora.TARGETS.values()}
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(adapters))
  assert not any(np.any(np.asarray(adapters["layers"][f"lora_b_{w}"].get_value()))
                 for w, _ in lora.TARGETS.values())  # B = 0, as PEFT initialises it
  assert "wq" in frozen["layers"] and "lora_a_wq" not in frozen["layers"]
  assert lora.split(plain)[2] is None  # rank 0: the whole state trains, nothing frozen


def test_adapted_forward_equals_the_merged_weights():
  model = _nudged(_adapted())
  merged = lora.merged_model(model)
  assert not lora.has_adapters(merged)
  got, want = np.asarray(model(TOKENS, MASK)), np.asarray(merged(TOKENS, MASK))
  assert np.abs(got - np.asarray(Qwen2(CFG, rngs=nnx.Rngs(0))(TOKENS, MASK))).max() > 1e-2
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_adapter_gradients_are_the_chain_rule_through_the_merged_weight():
  """dL/dA = dL/dW' B^T s and dL/dB = A^T dL/dW' s, W' = W + s A B (here for wq and wo, whose
  input is one and two axes)."""
  model = _nudged(_adapted(targets="q_proj,o_proj"))
  graphdef, adapters, frozen = lora.split(model)
  loss = lambda m: jnp.sum(jnp.tanh(m(TOKENS, MASK)))
  g_ad = jax.grad(lambda a: loss(lora.merge(graphdef, (a, frozen))))(adapters)["layers"]
  merged = lora.merged_model(model)
  mg, mstate = nnx.split(merged)
  g_w = jax.grad(lambda s: loss(nnx.merge(mg, s)))(mstate)["layers"]
  s = model.layers.lora_scale
  for name, in_dims in (("wq", 1), ("wo", 2)):
    a = adapters["layers"][f"lora_a_{name}"].get_value()
    b = adapters["layers"][f"lora_b_{name}"].get_value()
    gw = g_w[name].get_value()
    n, r = a.shape[0], a.shape[-1]
    a2, b2, gw2 = a.reshape(n, -1, r), b.reshape(n, r, -1), gw.reshape(n, a.reshape(n, -1, r)
                                                                       .shape[1], -1)
    want_a = s * jnp.einsum("lio,lro->lir", gw2, b2).reshape(a.shape)
    want_b = s * jnp.einsum("lir,lio->lro", a2, gw2).reshape(b.shape)
    np.testing.assert_allclose(g_ad[f"lora_a_{name}"].get_value(), want_a, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(g_ad[f"lora_b_{name}"].get_value(), want_b, rtol=1e-4, atol=1e-6)
    assert in_dims == lora.TARGETS["q_proj" if name == "wq" else "o_proj"][1]


@pytest.mark.parametrize("weight_dtype", ["auto", "int8"])
def test_engine_decodes_with_adapters_as_with_merged_weights(weight_dtype):
  """The engine holds the base once and syncs only the adapters; its prefill equals the merged
  model's engine (int8: both quantise the same base, the adapters stay in the compute dtype,
  so they agree to int8's error of the merged delta)."""
  model = _nudged(_adapted(), scale=0.2)
  kw = dict(num_slots=SLOTS, max_prompt_len=P_LEN, max_len=MAX_LEN, weight_dtype=weight_dtype)
  eng, ref = Engine(model, **kw), Engine(lora.merged_model(model), **kw)
  synced = eng.load_params()
  assert set(synced["layers"]) == set(lora.split(model)[1]["layers"])  # adapters alone
  assert eng.sync_bytes() < 0.5 * ref.sync_bytes()
  prompt = [5, 9, 11, 2, 7]
  a = eng.prefill(params=synced, padded_tokens=_padded(prompt), true_length=5)
  b = ref.prefill(params=ref.load_params(), padded_tokens=_padded(prompt), true_length=5)
  la, lb = jax.nn.log_softmax(a.logits_NpxV), jax.nn.log_softmax(b.logits_NpxV)
  tol = 1e-4 if weight_dtype == "auto" else 0.05
  assert float(jnp.max(jnp.abs(la - lb))) < tol
  state = eng.insert(a, eng.init_decode_state(), 0)
  _, result = eng.generate(synced, state)  # decode runs with the adapters applied
  assert result.convert_to_numpy().get_result_at_slot(0).valid[0, 0]
  _, zero, _ = lora.split(_adapted())
  eng.load_params(zero, free_old=True)  # a sync moves adapters: now the base's outputs again
  c = eng.prefill(params=eng.load_params(), padded_tokens=_padded(prompt), true_length=5)
  assert float(jnp.max(jnp.abs(c.logits_NpxV - a.logits_NpxV))) > 1e-3


def test_checksum_tracks_the_weights():
  _, _, frozen = lora.split(_adapted())
  before = lora.checksum(frozen)
  assert lora.checksum(frozen) == before
  frozen["layers"]["wv"].set_value(frozen["layers"]["wv"].get_value().at[1, 3, 0, 2].add(1e-3))
  assert lora.checksum(frozen) != before


def test_config_targets_name_the_models():
  assert lora_checks.LORA_TARGETS == tuple(lora.TARGETS)


@pytest.mark.parametrize("field, value, match", [
    ("rank", -1, "lora.rank: must be an int >= 0"),
    ("alpha", 0.0, "lora.alpha: must be > 0"),
    ("targets", "q_proj,qkv", r"lora.targets: unknown \['qkv'\]"),
    ("targets", " , ", "lora.targets: unknown empty list"),
])
def test_config_refuses_bad_lora_fields(field, value, match):
  c = tiny_dict()
  c.lora.update({"rank": 4, field: value})
  with pytest.raises(ValueError, match=match):
    config_lib.parse(c)


def test_config_refuses_mlp_targets_on_a_moe_model():
  c = tiny_dict()
  c.model.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
  c.lora.update(rank=4, targets="q_proj,up_proj")
  with pytest.raises(ValueError, match=r"lora.targets: \['up_proj'\] on a MoE model"):
    config_lib.parse(c)


def test_attach_refuses_what_the_model_cannot_take():
  with pytest.raises(ValueError, match=r"lora.rank: 17 exceeds k_proj's smaller dimension "
                     r"\(32 in, 16 out\)"):
    _adapted(rank=17, targets="q_proj,k_proj")  # q_proj's 32 out would take it
  with pytest.raises(ValueError, match="lora.rank: 40 exceeds q_proj"):
    _adapted(rank=40, targets="q_proj")
  with pytest.raises(ValueError, match="no dense MLP .* expert weights are not adapted"):
    _adapted(targets="q_proj,gate_proj", cfg=MOE_CFG)
  moe = _nudged(_adapted(targets="q_proj,v_proj", cfg=MOE_CFG))  # attention only: served
  assert np.isfinite(np.asarray(moe(TOKENS, MASK))).all()
  with pytest.raises(ValueError, match="already has adapters"):
    lora.attach(moe, rank=2, alpha=1.0, targets="q_proj", seed=0)
