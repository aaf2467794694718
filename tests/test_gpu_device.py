"""On a real GPU (skipped elsewhere): "auto" runs jax's Pallas GPU kernels compiled (Triton), not
interpreted, and they agree with the reference paths there; greedy tokens through the GPU paged
kernel equal the dense cache's. Run by benchmarks/device_check.sh with
JAX_PLATFORMS=cuda,cpu; the same kernels run in interpret mode on CPU in
tests/test_attention_kernels.py, whose tolerances (ulps of the largest value) are used here.
"""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import sharding
from dapo_jax.models import attention, paged
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.rollout import device_fns
from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler
from tests import test_attention_kernels as kt
from tests.test_rollout_sampler import CFG, EOS, MAX_LEN, P_LEN, prompts_of


def _gpus():
  try:
    return jax.devices("gpu")
  except RuntimeError:  # no GPU backend in this process (JAX_PLATFORMS=cpu, or no CUDA jax)
    return []


pytestmark = pytest.mark.skipif(not _gpus(), reason="needs a GPU (benchmarks/device_check.sh)")
TRITON = "triton"  # XLA:GPU's custom call for a Pallas Triton kernel contains this


def _mesh():
  return sharding.make_mesh({"data": 1}, _gpus()[:1])


def _custom_calls(jitted, *args) -> str:
  return " ".join(sorted({line.split('custom_call_target="')[1].split('"')[0]
                          for line in jitted.lower(*args).compile().as_text().splitlines()
                          if 'custom_call_target="' in line}))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_auto_is_the_compiled_flash_kernel(dtype):
  mesh = _mesh()
  assert attention.resolve("auto", mesh) == "gpu_flash"
  (q, k, v, w), segs, read = kt._inputs(dtype, 128, kt.T, "packed")  # pylint: disable=protected-access
  fn = lambda q, k, v: attention.attend(q, k, v, *segs, impl="auto", block=64, mesh=mesh)
  loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)
  step = jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=(0, 1, 2))(*a)))
  assert TRITON in _custom_calls(step, q, k, v)
  got, g_got = step(q, k, v)
  blocked = lambda q, k, v: attention.blocked_attend(q, k, v, *segs, 64)
  with jax.default_matmul_precision("highest"):  # XLA:GPU's default f32 matmul is TF32
    want, g_want = kt._values_and_grads(blocked, q, k, v, w)  # pylint: disable=protected-access
  kt._assert_close(got, want, dtype, np.asarray(read))  # pylint: disable=protected-access
  for a, b in zip(g_got, g_want):
    kt._assert_close(a, b, dtype)  # pylint: disable=protected-access


def test_auto_is_the_compiled_paged_kernel():
  mesh = _mesh()
  spec = device_fns.paged_spec(mesh, max_len=32, slots=4, page_size=16, head_dim=64)
  assert spec.kernel == "gpu"
  ps = 16
  q, kp, vp, _, pos = kt._random_pool(0, jnp.float32)  # pylint: disable=protected-access
  kp, vp = (x.reshape(x.shape[0], -1, ps, x.shape[-1]) for x in (kp, vp))  # 8 pages of 16
  table = jnp.array([[1, 2], [3, 4], [5, 0], [6, 7]], jnp.int32)
  run = jax.jit(paged.attend_kernel, static_argnums=(6,))
  assert TRITON in _custom_calls(run, q, kp, vp, table, pos, None, spec)
  got = run(q, kp, vp, table, pos, None, spec)
  with jax.default_matmul_precision("highest"):
    want = paged.attend_reference(q, kp, vp, table, pos, None, spec)
  kt._assert_close(got, want, jnp.float32)  # pylint: disable=protected-access


def test_greedy_tokens_with_the_gpu_paged_kernel_equal_dense():
  model = Qwen2(dataclasses.replace(CFG, head_dim=16), rngs=nnx.Rngs(0))
  nnx.update(model, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x,
                                 nnx.state(model, nnx.Param)))
  kw = dict(num_slots=4, max_prompt_len=P_LEN, max_len=MAX_LEN, steps_per_call=8, mesh=_mesh())
  dense = GroupSampler(Engine(model, **kw))
  kernel = GroupSampler(Engine(model, paged_kv=True, page_size=16, **kw))
  assert kernel.engine._paged.kernel == "gpu"  # pylint: disable=protected-access
  prompts = prompts_of(3, seed=2)
  args = dict(group_size=2, max_new_tokens=12, temperature=0.0, seed=0, eos_ids=EOS)
  with jax.default_matmul_precision("highest"):  # no TF32 rounding on either side
    a, b = dense.sample_groups(prompts, **args), kernel.sample_groups(prompts, **args)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
