"""Tests of dapo_jax.models.qwen2: forward, chunked log-probs, KV-cache decode, config."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2, token_logprobs

CFG = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, rope_theta=10000.0)


def _model(cfg=CFG, seed=0):
  return Qwen2(cfg, rngs=nnx.Rngs(seed))


def _randint(seed, shape, high):
  return jnp.asarray(np.random.RandomState(seed).randint(0, high, shape), jnp.int32)


def _batch(b=3, t=12, seed=1, lengths=(12, 8, 5)):
  toks = _randint(seed, (b, t), CFG.vocab_size)
  mask = (jnp.arange(t)[None, :] < jnp.asarray(lengths)[:, None]).astype(jnp.int32)
  return toks, mask


_forward = nnx.jit(lambda m, t, k: m(t, k))


def _naive_logprobs(model, toks, mask, temperature=1.0):
  """Reference: the full [B, T, V] log-softmax (fine at toy sizes)."""
  logits = _forward(model, toks, mask) / temperature
  logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(logp_all, toks[:, 1:, None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  pad = jnp.zeros((toks.shape[0], 1))
  m = mask > 0
  return (jnp.where(m, jnp.concatenate([pad, logp], 1), 0.0),
          jnp.where(m, jnp.concatenate([pad, ent], 1), 0.0))


# ----- config ----------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,match", [
    ("vocab_size", 0, "vocab_size"), ("num_kv_heads", 3, "num_kv_heads"),
    ("head_dim", 7, "head_dim"), ("dtype", "float64", "dtype"),
    ("architecture", "gpt2", "architecture"), ("rope_theta", -1.0, "rope_theta"),
    ("logits_chunk", 0, "logits_chunk"), ("remat", 1, "remat"),
    ("rope_scaling", {"rope_type": "yarn"}, "rope_scaling"),
    ("rope_scaling", {"rope_type": "llama3", "factor": 8.0}, "missing"),
])
def test_config_rejects_bad_fields(field, value, match):
  with pytest.raises(ValueError, match=match):
    dataclasses.replace(CFG, **{field: value})


def test_config_hf_dict_round_trip_and_errors():
  llama = dataclasses.replace(CFG, architecture="llama", attention_bias=False,
                              tie_word_embeddings=True, rope_scaling={
                                  "rope_type": "llama3", "factor": 8.0,
                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                  "original_max_position_embeddings": 64})
  for cfg in (CFG, llama, dataclasses.replace(CFG, architecture="qwen3", qk_norm=True,
                                              attention_bias=False)):
    assert ModelConfig.from_hf_dict(cfg.to_hf_dict()) == cfg
    assert hash(ModelConfig.from_hf_dict(cfg.to_hf_dict())) == hash(cfg)
  d = CFG.to_hf_dict()
  with pytest.raises(ValueError, match="unsupported architecture.*'gpt2'"):
    ModelConfig.from_hf_dict({**d, "model_type": "gpt2"})
  with pytest.raises(ValueError, match="hidden_act"):
    ModelConfig.from_hf_dict({**d, "hidden_act": "gelu"})
  with pytest.raises(ValueError, match="rope_type='yarn'"):
    ModelConfig.from_hf_dict({**d, "rope_parameters": {"rope_type": "yarn"}})
  with pytest.raises(ValueError, match="unknown ModelConfig override"):
    ModelConfig.from_hf_dict(d, dtypo="bfloat16")
  with pytest.raises(ValueError, match="attention_bias=False"):
    dataclasses.replace(CFG, attention_bias=False).to_hf_dict()


def test_num_params_matches_model():
  for cfg in (CFG, dataclasses.replace(CFG, tie_word_embeddings=True, qk_norm=True)):
    state = nnx.state(nnx.eval_shape(lambda c=cfg: _model(c)))
    assert sum(x.size for x in jax.tree.leaves(state)) == cfg.num_params


# ----- forward ---------------------------------------------------------------------------
def test_forward_shapes_and_padding_invariance():
  model = _model()
  toks, mask = _batch()
  logits = _forward(model, toks, mask)
  assert logits.shape == (3, 12, 128) and logits.dtype == jnp.float32
  # Changing pad tokens must not change logits of real tokens.
  toks2 = jnp.where(mask > 0, toks, (toks + 7) % 128)
  np.testing.assert_allclose(_forward(model, toks2, mask)[1, :8], logits[1, :8], atol=1e-6)
  # Left padding with default positions equals the unpadded row.
  left = jnp.concatenate([jnp.zeros((1, 4), toks.dtype), toks[2:, :5]], axis=1)
  left_mask = jnp.concatenate([jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 5), jnp.int32)], 1)
  np.testing.assert_allclose(_forward(model, left, left_mask)[0, 4:], logits[2, :5], atol=1e-5)
  assert np.isfinite(np.asarray(_forward(model, left, left_mask))).all()


def test_bfloat16_runs_close_to_float32():
  model = _model()
  bf = _model(dataclasses.replace(CFG, dtype="bfloat16", param_dtype="bfloat16"))
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(bf)))
  nnx.update(bf, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(model)))
  toks, mask = _batch()
  out = _forward(bf, toks, mask)
  assert out.dtype == jnp.float32
  # bf16 weights and activations: ~3 significant digits on O(1) logits; 5e-2 would also pass a
  # wrong formula, so the bound is as tight as bf16 allows.
  np.testing.assert_allclose(out, _forward(model, toks, mask), atol=1e-2)


def test_bad_inputs_raise():
  model = _model()
  toks, mask = _batch()
  with pytest.raises(ValueError, match="mask_BxT shape"):
    model(toks, mask[:, :5])
  with pytest.raises(ValueError, match="tokens_BxT must have rank 2"):
    model(toks[0], mask[0])
  with pytest.raises(ValueError, match="temperature"):
    token_logprobs(model, toks, mask, temperature=0.0)
  with pytest.raises(ValueError, match="chunk_size"):
    token_logprobs(model, toks, mask, chunk_size=0)
  with pytest.raises(ValueError, match="cache_len"):
    model.prefill(toks, jnp.array([3, 3, 3]), cache_len=4)
  cache = model.init_cache(2, 8)
  with pytest.raises(ValueError, match="batch 3"):
    model.decode_step(toks[:, 0], jnp.zeros(3, jnp.int32), cache)
  with pytest.raises(ValueError, match="positions_B shape"):
    model.decode_step(toks[:2, 0], jnp.zeros(3, jnp.int32), cache)


# ----- chunked log-probs -----------------------------------------------------------------
@pytest.mark.parametrize("chunk_size,temperature", [(512, 1.0), (4, 0.7)])
def test_token_logprobs_match_naive(chunk_size, temperature):
  model = _model()
  toks, mask = _batch()
  fn = nnx.jit(lambda m, t, k: token_logprobs(m, t, k, temperature=temperature,
                                                chunk_size=chunk_size))
  logp, ent = fn(model, toks, mask)
  ref_logp, ref_ent = _naive_logprobs(model, toks, mask, temperature)
  np.testing.assert_allclose(logp, ref_logp, atol=1e-5)
  np.testing.assert_allclose(ent, ref_ent, atol=1e-5)
  assert float(jnp.abs(logp[:, 0]).max()) == 0.0
  assert float(jnp.abs(jnp.where(mask == 0, logp, 0.0)).max()) == 0.0
  assert float(logp.max()) <= 0.0 and float(ent.min()) >= 0.0
  logp_only, none = nnx.jit(lambda m, t, k: token_logprobs(
      m, t, k, chunk_size=chunk_size, temperature=temperature, with_entropy=False))(
          model, toks, mask)
  assert none is None
  np.testing.assert_allclose(logp_only, ref_logp, atol=1e-5)


def test_gradients_match_naive_with_chunking_and_remat():
  """Chunked log-probs, chunked attention and remat change memory, never the gradient."""
  model = _model()
  chunked = _model(dataclasses.replace(CFG, attention_chunk=5, remat=True))
  nnx.update(chunked, nnx.state(model))
  toks, mask = _batch()
  np.testing.assert_allclose(_forward(chunked, toks, mask), _forward(model, toks, mask),
                             atol=1e-5)
  w = jnp.asarray(np.random.RandomState(3).randn(*toks.shape), jnp.float32)

  def loss(fn):
    def f(m):
      logp, ent = fn(m)
      return jnp.sum(w * logp) + 0.1 * jnp.sum(ent)
    return nnx.jit(nnx.grad(f))

  g_ref = loss(lambda m: _naive_logprobs(m, toks, mask))(model)
  g = loss(lambda m: token_logprobs(m, toks, mask, chunk_size=7))(chunked)
  for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def _avals(jaxpr):
  """Every intermediate's abstract value, including inside scan/remat/cond bodies."""
  for eqn in jaxpr.eqns:
    yield from (v.aval for v in eqn.outvars)
    for p in eqn.params.values():
      for sub in (p if isinstance(p, (tuple, list)) else (p,)):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          yield from _avals(sub)


def test_token_logprobs_never_builds_full_logits():
  model = _model()
  b, t, v = 2, 65, CFG.vocab_size
  toks = _randint(0, (b, t), v)
  mask = jnp.ones((b, t), jnp.int32)

  def loss(m):
    return jnp.sum(token_logprobs(m, toks, mask, chunk_size=16)[0])

  graphdef, state = nnx.split(model)
  jaxpr = jax.make_jaxpr(jax.grad(lambda s: loss(nnx.merge(graphdef, s))))(state).jaxpr
  vocab_sized = [a.size for a in _avals(jaxpr)
                 if getattr(a, "ndim", 0) == 3 and a.shape[-1] == v]
  assert vocab_sized, "expected per-chunk [B, c, V] logits in the graph"
  # One chunk is [B, chunk_size // B, V]; the full logits would be [B, T - 1, V].
  assert max(vocab_sized) == b * (16 // b) * v < b * (t - 1) * v


# ----- KV cache --------------------------------------------------------------------------
def test_prefill_then_decode_equals_full_forward():
  model = _model()
  full_toks = _randint(5, (3, 16), 128)
  full = _forward(model, full_toks, jnp.ones_like(full_toks))
  lengths = jnp.array([6, 2, 9])  # rows at different positions
  prompts = jnp.where(jnp.arange(10)[None] < lengths[:, None], full_toks[:, :10], 0)
  prefill = nnx.jit(lambda m, t, l: m.prefill(t, l, cache_len=16))
  decode = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))
  last, cache = prefill(model, prompts, lengths)
  assert cache["k"].shape == (2, 3, 16, 2, 8)
  rows = jnp.arange(3)
  np.testing.assert_allclose(last, full[rows, lengths - 1], atol=1e-5)
  pos = lengths
  for _ in range(6):
    logits, cache = decode(model, full_toks[rows, pos], pos, cache)
    np.testing.assert_allclose(logits, full[rows, pos], atol=1e-5)
    pos = pos + 1
  # Cache shape S = T when no cache_len is given.
  assert model.prefill(prompts, lengths)[1]["v"].shape == (2, 3, 10, 2, 8)


def test_decode_from_empty_cache_equals_full_forward():
  cfg = dataclasses.replace(CFG, qk_norm=True, attention_bias=False, architecture="qwen3",
                            tie_word_embeddings=True)
  model = _model(cfg)
  toks = _randint(6, (2, 8), 128)
  full = _forward(model, toks, jnp.ones_like(toks))
  cache = model.init_cache(2, 8)
  assert cache["k"].dtype == jnp.float32 and cache["k"].shape == (2, 2, 8, 2, 8)
  decode = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))
  for i in range(8):
    logits, cache = decode(model, toks[:, i], jnp.full((2,), i), cache)
    np.testing.assert_allclose(logits, full[:, i], atol=1e-5)


@pytest.mark.parametrize("heads,kv_heads", [(4, 2), (3, 3), (4, 1)])
def test_single_query_attention_equals_general_attention(heads, kv_heads):
  from dapo_jax.models import layers
  rng = np.random.RandomState(heads + kv_heads)
  q = rng.randn(3, 1, heads, 8).astype(np.float32)
  k = rng.randn(3, 10, kv_heads, 8).astype(np.float32)
  v = rng.randn(3, 10, kv_heads, 8).astype(np.float32)
  allowed = rng.rand(3, 10) < 0.6
  allowed[:, 0] = True
  np.testing.assert_allclose(jax.jit(layers.attend_one)(q, k, v, allowed),
                             jax.jit(layers.attend)(q, k, v, allowed[:, None, :]), atol=1e-5)
