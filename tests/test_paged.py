"""Paged KV cache: same tokens and log-probs as the dense cache (any pool size, layer loop,
mesh), prompt pages shared by a group, pages returned, preemption under a tight pool, the
Pallas kernel (interpret mode) against the reference path, budget sizing and bad inputs."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas.ops.tpu import paged_attention as tpu_paged

from dapo_jax import sharding
from dapo_jax.models import paged
from dapo_jax.models.qwen2 import ModelConfig
from dapo_jax.rollout import budget, device_fns, pages
from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler, make_sampler
from tests.test_rollout_sampler import EOS, MAX_LEN, P_LEN, prompts_of, tiny_model

KW = dict(group_size=4, max_new_tokens=20, temperature=1.0, seed=3, eos_ids=EOS)


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.fixture(scope="module")
def dense(model):
  return make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN, steps_per_call=4)


def _same(a, b):
  np.testing.assert_array_equal(a.lengths, b.lengths)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


# The pool: 0 = default (every slot at full length); 9 = 1 null page + 8, one sequence of 40
# tokens holds 5 pages of 8: samples are preempted and re-run.
@pytest.mark.parametrize("layer_loop", ["unrolled", "scan"])
@pytest.mark.parametrize("num_pages", [None, 9])
def test_paged_equals_dense(model, dense, layer_loop, num_pages):
  s = GroupSampler(Engine(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN,
                          steps_per_call=4, layer_loop=layer_loop, paged_kv=True, page_size=8,
                          num_pages=num_pages))
  prompts = prompts_of(5, seed=4)
  a, b = dense.sample_groups(prompts, **KW), s.sample_groups(prompts, **KW)
  _same(a, b)
  if num_pages:
    assert b.stats["preemptions"] > 0 and b.stats["pages_peak"] <= num_pages - 1
    assert b.stats["pool_peak_frac"] == 1.0  # one shard: its pool ran out
  else:
    assert b.stats["preemptions"] == 0 and 0 < b.stats["pool_peak_frac"] < 1


# (data 2, tensor 2) with 12 pages: 2 shards of 1 null page + 5, each shard's 4 rows preempt.
@pytest.mark.parametrize("axes,num_pages", [({"data": 8}, None),
                                            ({"data": 2, "fsdp": 2, "tensor": 2}, None),
                                            ({"data": 2, "tensor": 2}, 12)])
def test_paged_on_meshes(model, dense, axes, num_pages):
  mesh = sharding.make_mesh(axes, jax.devices()[:int(np.prod(list(axes.values())))])
  s = make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN, steps_per_call=4,
                   mesh=mesh, paged_kv=True, page_size=8, num_pages=num_pages)
  prompts = prompts_of(4, seed=6)
  got = s.sample_groups(prompts, **KW)
  _same(dense.sample_groups(prompts, **KW), got)
  assert (got.stats["preemptions"] > 0) == (num_pages is not None)
  pool = s.engine.init_decode_state().cache["k"]
  assert pool.sharding.spec[2] is not None  # pages really split over the batch axes


def test_pool_shares_prompt_pages_and_returns_them():
  pool = pages.PagePool(num_pages=2 * 12, shards=2, slots=4, page_size=4, max_len=20)
  assert pool.admit(0, prompt=7, prompt_len=10) == [(0, 1), (1, 2), (2, 3)]
  # The group's second sample shares the 2 full pages and gets its own partial page.
  assert pool.admit(1, prompt=7, prompt_len=10) == [(2, 4)]
  assert list(pool.table[1, :3]) == [1, 2, 4] and pool.in_use() == 4
  # Another shard (rows 2, 3) has its own pages: the prompt is written there again.
  assert pool.admit(2, prompt=7, prompt_len=10) == [(0, 13), (1, 14), (2, 15)]
  assert pool.grow(2, 12) and pool.table[2, 3] == 16 and pool.held[2] == 4
  assert pool.grow(0, 19) and list(pool.table[0]) == [1, 2, 3, 5, 6]
  pool.release(0)
  assert pool.in_use() == 3 + 4 and list(pool.table[0]) == [0] * 5
  pool.release(1)
  assert pool.in_use() == 4  # the group's last user there returned the shared pages
  assert pool.admit(3, prompt=1, prompt_len=4 * 7) is None  # needs 7 + 1 of the 7 left
  assert pool.held[3] == 0 and pool.in_use() == 4  # a refused admission takes nothing
  with pytest.raises(ValueError, match="cannot hold one sequence"):
    pages.PagePool(num_pages=5, shards=1, slots=2, page_size=4, max_len=20)


def _random_pool(layers):
  b, h, kv, d, n, ps = 4, 4, 2, 128, 16, 8
  ks = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(ks[0], (b, 1, h, d))
  shape = (kv, layers, n, ps, d) if layers else (kv, n, ps, d)
  kp, vp = jax.random.normal(ks[1], shape), jax.random.normal(ks[2], shape)
  # Rows of shard 0 (rows 0, 1) hold pages of [0, 8), shard 1's of [8, 16) (2 shards).
  table = jnp.array([[1, 2, 0, 0], [3, 4, 5, 6], [9, 0, 0, 0], [10, 11, 12, 8]], jnp.int32)
  return q, kp, vp, table, jnp.array([9, 31, 3, 27], jnp.int32)


@pytest.mark.parametrize("layers", [0, 3])
@pytest.mark.parametrize("axes", [{"data": 1}, {"data": 2, "tensor": 2}])
def test_kernel_matches_reference(cpu_devices, layers, axes):
  mesh = sharding.make_mesh(axes, cpu_devices[:int(np.prod(list(axes.values())))])
  spec = paged.PagedSpec(page_size=8, max_len=32, kernel="tpu", mesh=mesh, pages_per_block=2)
  q, kp, vp, table, pos = _random_pool(layers)
  layer = jnp.int32(layers - 1) if layers else None
  ref = paged.attend_reference(q, kp, vp, table, pos, layer, spec)
  with pltpu.force_tpu_interpret_mode():
    got = jax.jit(paged.attend_kernel, static_argnums=(6,))(q, kp, vp, table, pos, layer, spec)
  # The kernel's matmuls run at TPU default precision (bf16 passes) in interpret mode too.
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-2, rtol=0)
  assert float(jnp.abs(got - ref).max()) < 2e-2 < float(jnp.abs(got).max())


def test_kernel_rows_split_to_fit_scalar_memory(cpu_devices, monkeypatch):
  """A page table past the TPU's scalar memory runs in several kernel calls, same values."""
  assert paged.tpu_row_calls(256, 1408) == (2, 128)  # 30B-A3B on v5p-64: 1.4 MB in one call
  assert paged.tpu_row_calls(128, 1408) == (1, 128)  # the 32B on v5p-128: 0.7 MB, one call
  monkeypatch.setattr(paged, "TPU_TABLE_SMEM_BYTES", 2 * 4 * 4)  # 2 rows of 4 pages a call
  assert paged.tpu_row_calls(4, 4) == (2, 2) and paged.tpu_row_calls(3, 4) == (2, 2)
  mesh = sharding.make_mesh({"data": 1}, cpu_devices[:1])
  spec = paged.PagedSpec(page_size=8, max_len=32, kernel="tpu", mesh=mesh, pages_per_block=2)
  q, kp, vp, table, pos = _random_pool(0)
  ref = paged.attend_reference(q, kp, vp, table, pos, None, spec)
  calls, kernel = [], tpu_paged.paged_attention
  monkeypatch.setattr(tpu_paged, "paged_attention",
                      lambda q, *a, **kw: calls.append(q.shape[0]) or kernel(q, *a, **kw))
  with pltpu.force_tpu_interpret_mode():
    got = paged.attend_kernel(q, kp, vp, table, pos, None, spec)
  assert calls == [2, 2]  # the 4 rows in two calls
  np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=2e-2, rtol=0)


def test_budget_sizes_pages():
  mcfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, head_dim=8)
  shape = {"data": 2, "fsdp": 1, "tensor": 2}
  per_page = budget.slot_bytes_per_chip(mcfg, max_len=16, tensor=2)  # 2 x 2 x 16 x 1 x 8 x 4
  assert per_page == 2048
  got = budget.sampler_pages(kv_cache_gib=100 * 2048 / 2**30, mcfg=mcfg, max_len=64,
                             page_size=16, mesh_shape=shape)
  assert got == 200
  assert budget.sampler_pages(kv_cache_gib=0, mcfg=mcfg, max_len=64, page_size=16,
                              mesh_shape=shape) is None
  with pytest.raises(ValueError, match="config.rollout.kv_cache_gib: .* fewer than one sequence"):
    budget.sampler_pages(kv_cache_gib=4 * 2048 / 2**30, mcfg=mcfg, max_len=64, page_size=16,
                         mesh_shape=shape)
  kw = dict(kv_cache_gib=0.0, group_size=4, mcfg=mcfg, max_len=64, mesh_shape=shape,
            paged=True)
  assert budget.sampler_slots(num_slots=64, hosts=4, **kw) == 16
  with pytest.raises(ValueError, match="config.rollout.num_slots: 5 concurrent"):
    budget.sampler_slots(num_slots=5, hosts=1, **kw)


def test_bad_inputs(model):
  kw = dict(num_slots=4, max_prompt_len=P_LEN, max_len=MAX_LEN, paged_kv=True)
  with pytest.raises(ValueError, match="page_size: must be a positive int"):
    Engine(model, page_size=0, **kw)
  with pytest.raises(ValueError, match="num_pages: 3 must be"):
    Engine(model, num_pages=3, **kw)
  with pytest.raises(ValueError, match="paged_impl: must be one of"):
    Engine(model, paged_impl="fast", **kw)
  with pytest.raises(ValueError, match="num_slots: 3 slots do not split"):
    Engine(model, **dict(kw, num_slots=3), mesh=sharding.make_mesh({"data": 2}, jax.devices()[:2]))
  eng = Engine(model, **kw)
  st = eng.init_decode_state()
  with pytest.raises(ValueError, match="insert: JetStream's slot API needs the dense cache"):
    eng.insert(eng.prefill(params=eng.params, padded_tokens=[5], true_length=1), st, 0)
  with pytest.raises(ValueError, match="page_table: needed exactly when"):
    eng.generate_chunk(eng.params, st, stop_on_finish=False)
  spec = device_fns.paged_spec(eng.mesh, max_len=40, slots=4, page_size=8, head_dim=128)
  assert spec.pages_per_block == 1 and not spec.kernel  # CPU: the reference path
  with pytest.raises(ValueError, match="paged_impl: the TPU kernel needs head_dim"):
    Engine(model, paged_impl="kernel", **kw)


def test_config_fields():
  from configs import tiny_cpu  # pylint: disable=import-outside-toplevel
  from dapo_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  c = tiny_cpu.get_config()
  r = config_lib.parse(c).rollout
  assert (r.paged_kv, r.page_size) == (True, 16)
  c.rollout.page_size = 0
  with pytest.raises(ValueError, match="config.rollout.page_size: must be > 0"):
    config_lib.parse(c)
