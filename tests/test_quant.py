"""int8 sampler weights (models/quant.py): the quantiser's error bound, the int8 matmul's
algebra, an Engine decoding with them, and what int8 refuses."""
import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import config as config_lib
from dapo_jax.config import checks
from dapo_jax.models import layers, quant
from dapo_jax.models.qwen2 import ModelConfig
from dapo_jax.rollout.engine import Engine
from tests.test_rollout_engine import CFG, MAX_LEN, P_LEN, SLOTS, _padded, tiny_model


def test_quantize_is_within_half_a_step_per_channel():
  w = jax.random.normal(jax.random.key(0), (3, 16, 4, 8)) * jnp.arange(1, 9.0).reshape(1, 1, 1, 8)
  w = w.at[1, :, 2, 5].set(0.0)  # an all-zero channel
  qw = quant.quantize(w, 1)
  assert qw.q.dtype == jnp.int8 and qw.scale.shape == (3, 1, 4, 8)
  assert float(qw.scale[1, 0, 2, 5]) == 1.0 and not np.any(np.asarray(qw.q[1, :, 2, 5]))
  err = np.abs(np.asarray(qw.q * qw.scale - w))
  assert np.all(err <= np.asarray(qw.scale) / 2 + 1e-7)
  assert int(np.abs(np.asarray(qw.q)).max()) == 127
  one = qw[2]
  assert one.shape == (16, 4, 8) and isinstance(one, quant.Int8Weight)
  wo = quant.quantize(jax.random.normal(jax.random.key(1), (2, 4, 8, 16)), 2)  # [L, H, K, D]
  assert wo.scale.shape == (2, 1, 1, 16)


@pytest.mark.parametrize("in_dims, shape", [(1, (16, 4, 8)), (2, (4, 8, 16))])
def test_dense_with_int8_is_the_matmul_of_the_dequantised_weight(in_dims, shape):
  w = jax.random.normal(jax.random.key(2), shape)
  qw = quant.quantize(w, in_dims, stacked=False)
  x = jax.random.normal(jax.random.key(3), (2, 5, *shape[:in_dims]))
  got = layers.dense(x, qw, in_dims=in_dims)
  want = layers.dense(x, qw.q.astype(jnp.float32) * qw.scale, in_dims=in_dims)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  full = np.asarray(layers.dense(x, w, in_dims=in_dims))
  assert np.abs(np.asarray(got) - full).max() < 0.02 * np.abs(full).max()


def test_int8_engine_decodes_close_to_the_full_precision_one():
  model = tiny_model()
  full = Engine(model, num_slots=SLOTS, max_prompt_len=P_LEN, max_len=MAX_LEN)
  eng = Engine(model, num_slots=SLOTS, max_prompt_len=P_LEN, max_len=MAX_LEN,
               weight_dtype="int8")
  params = eng.load_params()
  assert isinstance(params["layers"]["wq"].get_value(), quant.Int8Weight)
  assert quant.weight_bytes(params) < 0.5 * quant.weight_bytes(full.load_params())
  prompt = [5, 9, 11, 2, 7]
  a = full.prefill(params=full.load_params(), padded_tokens=_padded(prompt), true_length=5)
  b = eng.prefill(params=params, padded_tokens=_padded(prompt), true_length=5)
  la, lb = jax.nn.log_softmax(a.logits_NpxV), jax.nn.log_softmax(b.logits_NpxV)
  gap = float(jnp.max(jnp.abs(la - lb)))
  assert 0 < gap < 0.1 * float(jnp.max(jnp.abs(la)))  # int8 moves the logits, a little
  state = eng.insert(b, eng.init_decode_state(), 0)
  state, result = eng.generate(params, state)  # decode runs on the int8 weights
  assert result.convert_to_numpy().get_result_at_slot(0).valid[0, 0]
  new = eng.load_params(nnx.state(tiny_model(seed=3), nnx.Param))  # a weight sync quantises
  assert isinstance(new["layers"]["w_down"].get_value(), quant.Int8Weight)
  assert not np.array_equal(np.asarray(new["layers"]["wq"].get_value().q),
                            np.asarray(params["layers"]["wq"].get_value().q))


def test_what_int8_refuses():
  moe = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, architecture="qwen3_moe",
                    num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
  with pytest.raises(ValueError, match="rollout.weight_dtype: 'int8' .* MoE layers"):
    quant.check_model(moe, "int8")
  with pytest.raises(ValueError, match="rollout.weight_dtype: 'int4'"):
    quant.check_model(CFG, "int4")
  assert checks.SAMPLER_WEIGHT_DTYPES == quant.WEIGHT_DTYPES
  c = importlib.import_module("configs.tiny_cpu").get_config()
  c.rollout.weight_dtype = "fp8"
  with pytest.raises(ValueError, match="config.rollout.weight_dtype: must be one of"):
    config_lib.parse(c)
  c = importlib.import_module("configs.tiny_moe_cpu").get_config()
  c.rollout.weight_dtype = "int8"
  with pytest.raises(ValueError, match="config.rollout.weight_dtype: 'int8' quantises"):
    config_lib.parse(c)
