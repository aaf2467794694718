"""The fused attention kernels executed on CPU, not only compiled: the TPU splash kernel in Pallas'
TPU interpret mode and jax's Pallas GPU (Triton) flash and paged kernels in Pallas' interpret
mode, against the reference paths (`blocked_attend`, the paged reference gather), values and
gradients, float32 and bfloat16; greedy tokens of the GPU paged kernel equal the dense cache's;
what "auto" picks per platform; the interpret-mode deadlock guard.

Tolerances (`_atol`), as ulps of the largest |value| compared (values here are O(1)-O(10)):
- float32: 32 ulps. Both sides compute the same sums of <= 256 terms, exponentials and
  normalisations in another order (running maxima differ by block); ~7 ulps are seen.
- bfloat16: 2 ulps (bf16 keeps 8 significant bits: 1 ulp is 2^-7 of the leading power of two).
  Both sides round the same bf16 inputs, accumulate in float32 and round probabilities and
  results to bf16 once, so they differ by last-bit roundings: 1 ulp is seen. A masking slip
  (a key of another segment) moves values by O(1) / segment length: the float32 check, 2^16
  times tighter, is the one that catches those.
"""
import contextlib
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from dapo_jax import sharding
from dapo_jax.models import attention, attention_gpu, attention_shard, paged
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.rollout import device_fns
from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler
from tests.test_rollout_sampler import CFG, EOS, MAX_LEN, P_LEN, prompts_of

B, T, H, KV = 4, 200, 4, 2  # T pads to 256 for splash (blocks of 128) and the GPU kernel
MESH = {"data": 2, "tensor": 2}  # 4 of the 8 CPU devices: see test_interpret_guard


def _atol(want, dtype) -> float:
  top = float(np.max(np.abs(want)))
  ulp = 2.0 ** (np.floor(np.log2(top)) - (23 if dtype == jnp.float32 else 7))
  return (32 if dtype == jnp.float32 else 2) * ulp


def _assert_close(got, want, dtype, where=None):
  got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
  if where is not None:
    got, want = got[where], want[where]
  np.testing.assert_allclose(got, want, rtol=0, atol=_atol(want, dtype))


def _packed(t):
  """Ragged packed rows (segment ids 1, 2, ..., 0 = padding); T itself is padded to the
  kernels' blocks. Every query is compared (padding queries see padding on both sides)."""
  seg = np.zeros((B, t), np.int32)
  seg[0, :37], seg[0, 37:150], seg[0, 150:151] = 1, 2, 3  # a one-token segment, then padding
  seg[1, :t - 56], seg[1, t - 56:] = 1, 2
  seg[2, :] = 1                                           # one sequence filling the row
  seg[3, :5], seg[3, 5:90] = 1, 2
  seg = jnp.asarray(seg)
  return seg, seg, np.ones((B, t), bool)


def _right_padded(t):
  """Unpacked rows: q_seg 1, kv_seg = mask; only the real queries are compared and read."""
  mask = (jnp.arange(t)[None] < jnp.array([t, 20, 3, 30])[:, None]).astype(jnp.int32)
  return jnp.ones_like(mask), mask, np.asarray(mask > 0)


CASES = {"packed": _packed, "right_padded": _right_padded}


def _inputs(dtype, d, t, case):
  ks = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(ks[0], (B, t, H, d)).astype(dtype)
  k, v = (jax.random.normal(x, (B, t, KV, d)).astype(dtype) for x in ks[1:3])
  q_seg, kv_seg, read = CASES[case](t)
  w = jax.random.normal(ks[3], (B, t, H, d)) * read[:, :, None, None]  # the loss's cotangent
  return (q, k, v, w), (q_seg, kv_seg), read


def _values_and_grads(fn, q, k, v, w):
  loss = lambda q, k, v: jnp.sum(fn(q, k, v).astype(jnp.float32) * w)
  return jax.jit(lambda *a: (fn(*a), jax.grad(loss, argnums=(0, 1, 2))(*a)))(q, k, v)


@functools.lru_cache(maxsize=None)
def _blocked(dtype, d, t, case):
  """blocked_attend's values and gradients, computed once for the kernels' tests."""
  qkvw, segs, _ = _inputs(dtype, d, t, case)
  return _values_and_grads(lambda q, k, v: attention.blocked_attend(q, k, v, *segs, 64), *qkvw)


def _check_against_blocked(impl, dtype, d, case, t=T, context=contextlib.nullcontext,
                           axes=None):
  mesh = sharding.make_mesh(axes or MESH, jax.devices()[:4])
  qkvw, segs, read = _inputs(dtype, d, t, case)
  kernel = lambda q, k, v: attention.attend(q, k, v, *segs, impl=impl, block=64, mesh=mesh)
  with context():
    got, g_got = _values_and_grads(kernel, *qkvw)
  assert got.dtype == dtype and all(g.dtype == dtype for g in g_got)
  want, g_want = _blocked(dtype, d, t, case)
  _assert_close(got, want, dtype, read)
  for a, b in zip(g_got, g_want):
    _assert_close(a, b, dtype)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_splash_interpreted_equals_blocked(dtype):
  """The TPU splash kernel (forward, dq and dkv kernels) in TPU interpret mode, 2 rows per
  shard (one kernel call each), on packed ragged rows, head_dim 128 (the TPU lane width)."""
  _check_against_blocked("splash", dtype, 128, "packed",
                         context=pltpu.force_tpu_interpret_mode)


def test_splash_context_parallel_interpreted_equals_blocked():
  """Context parallelism (mesh.context = 2): each shard's splash kernel, its queries at offset
  shard x 128 of the gathered keys (the kernel per offset), equals blocked on the whole rows."""
  _check_against_blocked("splash", jnp.float32, 128, "packed",
                         context=pltpu.force_tpu_interpret_mode,
                         axes={"data": 1, sharding.CONTEXT: 2, "tensor": 2})


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_gpu_flash_interpreted_equals_blocked(dtype):
  """jax's Pallas GPU flash kernel (forward and backward) in interpret mode, same rows."""
  _check_against_blocked("gpu_flash", dtype, 128, "packed")


def test_gpu_flash_right_padded_rows():
  """Unpacked rows: every real query equals blocked (the kernel's one id array makes padded
  queries see the padding, which no loss reads); short T (37: blocks of 64) and head_dim 8
  (zero-padded to the kernel's 16)."""
  _check_against_blocked("gpu_flash", jnp.float32, 8, "right_padded", t=37)


def _random_pool(layers, dtype):
  b, h, kv, d, n, ps = 4, 4, 2, 64, 16, 8
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, 1, h, d)).astype(dtype)
  shape = (kv, layers, n, ps, d) if layers else (kv, n, ps, d)
  kp, vp = (jax.random.normal(x, shape).astype(dtype) for x in ks[1:])
  # Rows of shard 0 (rows 0, 1) hold pages of [0, 8), shard 1's of [8, 16) (2 shards).
  table = jnp.array([[1, 2, 0, 0], [3, 4, 5, 6], [9, 0, 0, 0], [10, 11, 12, 8]], jnp.int32)
  return q, kp, vp, table, jnp.array([9, 31, 3, 27], jnp.int32)


@pytest.mark.parametrize("layers,axes,dtype", [(0, {"data": 1}, jnp.float32),
                                               (3, {"data": 2, "tensor": 2}, jnp.float32),
                                               (3, {"data": 2, "tensor": 2}, jnp.bfloat16)])
def test_gpu_paged_kernel_equals_reference(layers, axes, dtype):
  """jax's Pallas GPU paged kernel (interpreted) over 2 pages per block in 2 parallel
  partitions of a row's 4 pages, layer folded into the page index, sharded like the pool."""
  mesh = sharding.make_mesh(axes, jax.devices()[:int(np.prod(list(axes.values())))])
  spec = paged.PagedSpec(page_size=8, max_len=32, kernel="gpu", mesh=mesh, pages_per_block=2)
  assert spec.gpu_splits == 2
  q, kp, vp, table, pos = _random_pool(layers, dtype)
  layer = jnp.int32(layers - 1) if layers else None
  ref = paged.attend_reference(q, kp, vp, table, pos, layer, spec)
  got = jax.jit(paged.attend_kernel, static_argnums=(6,))(q, kp, vp, table, pos, layer, spec)
  assert got.dtype == dtype
  _assert_close(got, ref, dtype)


def test_gpu_paged_greedy_tokens_equal_dense():
  """The sampler with the GPU paged kernel (interpreted) draws the dense cache's greedy
  tokens (head_dim 16, pages of 16: the kernel's smallest tiles)."""
  cfg = dataclasses.replace(CFG, head_dim=16)
  model = Qwen2(cfg, rngs=nnx.Rngs(0))
  nnx.update(model, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x,
                                 nnx.state(model, nnx.Param)))  # peaked, context-dependent
  kw = dict(num_slots=4, max_prompt_len=P_LEN, max_len=MAX_LEN, steps_per_call=8)
  dense = GroupSampler(Engine(model, **kw))
  kernel = GroupSampler(Engine(model, paged_kv=True, page_size=16, paged_impl="gpu_kernel", **kw))
  assert kernel.engine._paged.kernel == "gpu"  # pylint: disable=protected-access
  prompts = prompts_of(3, seed=2)
  args = dict(group_size=2, max_new_tokens=12, temperature=0.0, seed=0, eos_ids=EOS)
  a, b = dense.sample_groups(prompts, **args), kernel.sample_groups(prompts, **args)
  np.testing.assert_array_equal(a.lengths, b.lengths)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_auto_per_platform():
  assert [attention.auto_impl(p) for p in ("cpu", "tpu", "gpu")] == [
      "blocked", "splash", "gpu_flash"]
  mesh = sharding.make_mesh({"data": 2}, jax.devices()[:2])
  assert attention.resolve("auto", mesh) == "blocked"
  with pytest.raises(ValueError, match="attention_impl=gpu_flash needs the device mesh"):
    attention.resolve("gpu_flash", None)
  assert attention_gpu.flash_block(37) == 64 and attention_gpu.flash_block(500) == 128
  assert attention_gpu.flash_block(500, 128 * 4) == 64  # float32 tiles at head_dim 128

  def kernel(impl, platform, head_dim=128, page_size=16, per_block=1):
    return device_fns.paged_kernel(impl, platform=platform, head_dim=head_dim,
                                   page_size=page_size, pages_per_block=per_block)
  assert [kernel("auto", p) for p in ("cpu", "tpu", "gpu")] == ["", "tpu", "gpu"]
  assert kernel("auto", "tpu", head_dim=64) == ""                 # not the TPU lane width
  assert kernel("auto", "gpu", head_dim=64) == "gpu"
  assert kernel("auto", "gpu", head_dim=8) == ""                  # below Triton's 16
  assert kernel("auto", "gpu", page_size=8) == ""
  assert kernel("auto", "gpu", page_size=8, per_block=2) == "gpu"  # 16-token blocks
  assert kernel("kernel", "gpu") == "gpu" and kernel("kernel", "cpu") == "tpu"
  assert kernel("gpu_kernel", "cpu", head_dim=64) == "gpu" and kernel("reference", "tpu") == ""
  with pytest.raises(ValueError, match="paged_impl: the GPU kernel needs head_dim"):
    kernel("gpu_kernel", "gpu", head_dim=48)
  with pytest.raises(ValueError, match="PagedSpec.kernel: must be"):
    paged.PagedSpec(page_size=8, max_len=32, kernel=True)


def test_interpret_guard():
  """TPU interpret mode deadlocks when every CPU device runs the kernel: refused, not hung."""
  every = sharding.make_mesh({"data": 8}, jax.devices())
  with pytest.raises(ValueError, match="leaves one CPU device idle"):
    attention_shard.check_tpu_interpretable(every, "splash attention")
  q = jnp.zeros((8, 128, 1, 128))
  seg = jnp.ones((8, 128), jnp.int32)
  with pytest.raises(ValueError, match="splash attention: Pallas TPU interpret mode"):
    attention.splash_attend(q, q, q, seg, seg, mesh=every)
  attention_shard.check_tpu_interpretable(sharding.make_mesh(MESH, jax.devices()[:4]), "x")
