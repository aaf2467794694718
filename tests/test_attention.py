"""Training attention (models/attention.py): the blocked online-softmax path equals the dense
plain path in values and gradients, for packed segments and right-padded rows, at block sizes
that split T unevenly; the model's full forward through each implementation agrees; the
splash kernel compiles for a TPU topology (AOT, libtpu) inside a sharded jit."""
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models import attention
from dapo_jax.models.qwen2 import ModelConfig, Qwen2, token_logprobs

B, T, H, KV, D = 3, 37, 4, 2, 8
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _qkv(seed=0):
  ks = jax.random.split(jax.random.PRNGKey(seed), 4)
  return (jax.random.normal(ks[0], (B, T, H, D)), jax.random.normal(ks[1], (B, T, KV, D)),
          jax.random.normal(ks[2], (B, T, KV, D)), jax.random.normal(ks[3], (B, T, H, D)))


def _packed_segments():
  seg = np.zeros((B, T), np.int32)
  seg[0, :10], seg[0, 10:30] = 1, 2          # two sequences, then padding
  seg[1, :] = 1                              # one full row
  seg[2, :5], seg[2, 5:6], seg[2, 6:20] = 1, 2, 3  # a one-token sequence in the middle
  return jnp.asarray(seg)


def _padded_segments():
  mask = (jnp.arange(T)[None] < jnp.array([T, 20, 3])[:, None]).astype(jnp.int32)
  return jnp.ones_like(mask), mask


CASES = {"packed": lambda: (_packed_segments(),) * 2, "padded": _padded_segments}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("block", [8, 16, 64])
def test_blocked_equals_plain_values_and_grads(case, block):
  q, k, v, w = _qkv()
  q_seg, kv_seg = CASES[case]()
  valid = (q_seg > 0)[:, :, None, None] if case == "packed" else jnp.ones((B, T, 1, 1), bool)
  w = w * valid  # positions a loss would read (packed padding is never read)

  def loss(impl):
    return lambda q, k, v: jnp.sum(impl(q, k, v, q_seg, kv_seg) * w)

  blocked = lambda *a: attention.blocked_attend(*a, block)
  plain = lambda *a: attention.plain_attend(*a, chunk=1024)
  np.testing.assert_allclose(np.where(valid, blocked(q, k, v, q_seg, kv_seg), 0),
                             np.where(valid, plain(q, k, v, q_seg, kv_seg), 0), atol=2e-6)
  g_blocked = jax.grad(loss(blocked), argnums=(0, 1, 2))(q, k, v)
  g_plain = jax.grad(loss(plain), argnums=(0, 1, 2))(q, k, v)
  for a, b in zip(g_blocked, g_plain):
    np.testing.assert_allclose(a, b, atol=5e-6)


def test_segments_do_not_see_each_other():
  """Changing one packed sequence changes no output of its row-mates."""
  q, k, v, _ = _qkv()
  seg = _packed_segments()
  out = attention.blocked_attend(q, k, v, seg, seg, 8)
  k2 = k.at[0, 10:30].add(3.0)  # the second sequence of row 0
  out2 = attention.blocked_attend(q, k2, v, seg, seg, 8)
  np.testing.assert_array_equal(out[0, :10], out2[0, :10])
  assert not np.allclose(out[0, 10:30], out2[0, 10:30])


def test_resolve_and_bad_impl():
  assert attention.resolve("auto", None) == "blocked"
  assert attention.resolve("plain", None) == "plain"
  with pytest.raises(ValueError, match="config.model.attention_impl"):
    attention.resolve("flash", None)
  with pytest.raises(ValueError, match="needs the device mesh"):
    attention.resolve("splash", None)


@pytest.mark.parametrize("impl", ["blocked", "plain"])
def test_model_logprobs_equal_across_impls(impl):
  cfg = ModelConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8, attention_chunk=8)
  ref = Qwen2(dataclasses.replace(cfg, attention_impl="plain", attention_chunk=1024),
              rngs=nnx.Rngs(0))
  model = Qwen2(dataclasses.replace(cfg, attention_impl=impl), rngs=nnx.Rngs(0))
  tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 1, 40)
  mask = jnp.arange(T)[None] < jnp.array([T, 20, 9])[:, None]
  a, ea = token_logprobs(ref, tokens, mask)
  b, eb = token_logprobs(model, tokens, mask)
  np.testing.assert_allclose(a, b, atol=2e-5)
  np.testing.assert_allclose(ea, eb, atol=2e-5)


SPLASH_SCRIPT = r"""
import json, re, sys
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from dapo_jax import sharding
from dapo_jax.aot import topology
from dapo_jax.models import attention
mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2},
                          topology.devices(topology.parse("v5p-8")))
def loss(q, k, v, seg):
  o = attention.attend(q, k, v, seg, seg, impl="auto", block=256, mesh=mesh)
  return jnp.sum(o.astype(jnp.float32))
heads = P(("data", "fsdp"), None, "tensor", None)
sd = lambda shape, dt, spec: jax.ShapeDtypeStruct(shape, dt, sharding=NamedSharding(mesh, spec))
args = (sd((4, 500, 4, 128), jnp.bfloat16, heads), sd((4, 500, 2, 128), jnp.bfloat16, heads),
        sd((4, 500, 2, 128), jnp.bfloat16, heads), sd((4, 500), jnp.int32, P(("data", "fsdp"))))
text = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(*args).compile().as_text()
json.dump({"custom_calls": sorted(set(re.findall(r'custom_call_target="([^"]+)"', text))),
           "splash": "splash" in text, "resolved": attention.resolve("auto", mesh)}, sys.stdout)
"""


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="libtpu is not installed "
                    "(pip install -r requirements-dev.txt): TPU compiles need it")
def test_splash_compiles_for_tpu_with_gradients_under_shard_map():
  """The auto choice on a TPU mesh is splash; forward + backward compile for v5p-8 with batch
  and heads sharded, T = 500 padded to the kernel's blocks (AOT on CPU, libtpu)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  p = subprocess.run([sys.executable, "-c", SPLASH_SCRIPT], cwd=REPO, env=env,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout)
  assert out["resolved"] == "splash" and out["splash"], out
  assert "tpu_custom_call" in out["custom_calls"], out
