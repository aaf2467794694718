"""The decode and update fast paths compute what the plain ones do: unrolled vs scanned layers, decode
on a per-layer vs stacked cache, and live-prefix attention buckets vs the whole cache."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models import layers as L
from dapo_jax.models.qwen2 import ModelConfig, Qwen2, split_cache

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=3,
                  num_heads=4, num_kv_heads=2, head_dim=8)


def test_unrolled_layers_match_scan():
  model = Qwen2(CFG, rngs=nnx.Rngs(0))
  toks = jnp.asarray(np.random.default_rng(0).integers(0, 64, size=(2, 9)))
  mask = jnp.ones((2, 9), jnp.int32).at[1, 6:].set(0)
  scanned = model(toks, mask)
  model.cfg = dataclasses.replace(CFG, scan_layers=False)
  np.testing.assert_allclose(model(toks, mask), scanned, atol=1e-5, rtol=1e-5)
  _, c_scan = Qwen2(CFG, rngs=nnx.Rngs(0)).prefill(toks, jnp.asarray([9, 6]))
  _, c_unrolled = model.prefill(toks, jnp.asarray([9, 6]))
  np.testing.assert_allclose(c_unrolled["k"], c_scan["k"], atol=1e-5)


def test_decode_per_layer_cache_matches_stacked():
  model = Qwen2(CFG, rngs=nnx.Rngs(1))
  toks = jnp.asarray([[5, 6, 7, 8], [9, 10, 0, 0]])
  _, cache = model.prefill(toks, jnp.asarray([4, 2]), cache_len=100)
  tok, pos = jnp.asarray([11, 12]), jnp.asarray([4, 2])
  logits, new = model.decode_step(tok, pos, cache)
  ks, vs = split_cache(cache)
  logits2, new2 = model.decode_step(tok, pos, {"k": tuple(ks), "v": tuple(vs)},
                                    layer_params=model.layer_params())
  np.testing.assert_allclose(logits2, logits, atol=1e-6)
  assert isinstance(new2["k"], tuple) and len(new2["k"]) == CFG.num_layers
  np.testing.assert_allclose(jnp.stack(new2["k"]), new["k"], atol=1e-6)


def test_decode_buckets_and_prefix_attention():
  assert L.decode_buckets(192) == (64, 128, 192)
  assert L.decode_buckets(64) == (64,)
  assert L.decode_buckets(10) == (10,)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((3, 1, 4, 8)), jnp.float32)
  k = jnp.asarray(rng.standard_normal((3, 192, 2, 8)), jnp.float32)
  v = jnp.asarray(rng.standard_normal((3, 192, 2, 8)), jnp.float32)
  allowed = jnp.arange(192)[None, :] <= jnp.asarray([5, 70, 127])[:, None]
  full = L.attend_one(q, k, v, allowed)
  np.testing.assert_allclose(L.attend_one_prefix(q, k, v, allowed, n=128), full, atol=1e-6)


def test_layer_loop_choice():
  from dapo_jax import sharding  # pylint: disable=import-outside-toplevel
  from dapo_jax.rollout import device_fns  # pylint: disable=import-outside-toplevel
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices=jax.devices()[:1])
  assert device_fns.per_layer_decode(mesh) is True  # CPU: per-layer carry
  assert device_fns.per_layer_decode(mesh, "scan") is False
  with pytest.raises(ValueError, match="layer_loop: must be one of"):
    device_fns.per_layer_decode(mesh, "unroll")
