"""Group sampler: log-prob consistency, greedy, determinism, fan-out, continuous batching,
meshes, weight sync and bad inputs, on a tiny Qwen2."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax import sharding
from dapo_jax.models.qwen2 import ModelConfig, Qwen2, token_logprobs
from dapo_jax.rollout import flops
from dapo_jax.rollout.sampler import make_sampler
from tests import greedy_parity

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
P_LEN, MAX_LEN = 16, 40
EOS = (3,)
SCALE, HEAD_SCALE = 4.0, 8.0


def tiny_model(seed: int = 0) -> Qwen2:
  """Tiny Qwen2 whose weights are scaled up so next-token distributions are peaked and
  depend on the context (the 0.02 init gives nearly uniform ones)."""
  m = Qwen2(CFG, rngs=nnx.Rngs(seed))
  st = jax.tree.map(lambda x: x * SCALE if x.ndim >= 2 else x, nnx.state(m, nnx.Param))
  nnx.update(m, st)
  m.lm_head.set_value(m.lm_head.get_value() * HEAD_SCALE)
  return m


def prompts_of(n: int, seed: int = 0, lo: int = 1, hi: int = P_LEN):
  rng = np.random.default_rng(seed)
  return [rng.integers(4, CFG.vocab_size, size=int(rng.integers(lo, hi + 1))).tolist()
          for _ in range(n)]


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.fixture(scope="module")
def sampler(model):
  return make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN)


def _teacher_forced(model, prompts, rollout, temperature):
  """token_logprobs of [prompt][response] rows, returned at the response positions [N,G,T]."""
  n, g, t = rollout.tokens.shape
  width = P_LEN + t
  seq = np.zeros((n * g, width), np.int32)
  mask = np.zeros((n * g, width), np.int32)
  for i in range(n):
    for j in range(g):
      row, p, ln = i * g + j, len(prompts[i]), rollout.lengths[i, j]
      seq[row, :p], seq[row, p:p + ln] = prompts[i], rollout.tokens[i, j, :ln]
      mask[row, :p + ln] = 1
  logp, _ = token_logprobs(model, jnp.asarray(seq), jnp.asarray(mask), temperature=temperature)
  logp = np.asarray(logp)
  out = np.zeros((n, g, t), np.float32)
  for i in range(n):
    for j in range(g):
      p = len(prompts[i])
      out[i, j] = logp[i * g + j, p:p + t]
  return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_equal_teacher_forced(model, sampler, temperature):
  prompts = prompts_of(6)
  r = sampler.sample_groups(prompts, group_size=4, max_new_tokens=24, temperature=temperature,
                            seed=1, eos_ids=EOS)
  ref = _teacher_forced(model, prompts, r, temperature)
  mask = np.arange(r.tokens.shape[-1])[None, None, :] < r.lengths[:, :, None]
  diff = np.abs(np.where(mask, ref - r.logprobs, 0.0)).max()
  assert diff <= 1e-4, diff
  assert np.all(r.logprobs[~mask] == 0) and np.all(r.tokens[~mask] == 0)
  # Lengths, EOS and truncation agree with each other and with the budgets.
  for i, p in enumerate(prompts):
    for j in range(4):
      ln = r.lengths[i, j]
      assert 1 <= ln <= min(24, MAX_LEN - len(p))
      body = r.tokens[i, j, :ln - 1]
      assert not np.isin(body, EOS).any()
      assert r.truncated[i, j] == (r.tokens[i, j, ln - 1] not in EOS)
  assert r.truncated.any() and not r.truncated.all()


def _greedy_reference(model, prompt, steps):
  """Greedy decode by full forward passes (no KV cache), one token at a time."""
  graphdef, state = nnx.split(model)
  fwd = jax.jit(lambda st, x, m: nnx.merge(graphdef, st)(x, m))
  seq = np.zeros((1, P_LEN + steps), np.int32)
  seq[0, :len(prompt)] = prompt
  n = len(prompt)
  for _ in range(steps):
    mask = (np.arange(seq.shape[1]) < n)[None].astype(np.int32)
    logits = np.asarray(fwd(state, jnp.asarray(seq), jnp.asarray(mask)))
    seq[0, n] = int(np.argmax(logits[0, n - 1]))
    n += 1
  return seq[0, len(prompt):n]


def test_greedy_equals_model_greedy(model, sampler):
  prompts = prompts_of(3, seed=5)
  r = sampler.sample_groups(prompts, group_size=2, max_new_tokens=12, temperature=0.0, seed=9)
  greedy_parity.assert_groups_greedy(r, prompts, lambda p, n: _greedy_reference(model, p, n),
                                     steps=12, group_size=2)
  assert np.all(r.lengths == 12) and r.truncated.all()


def test_seeded_reproducible_whatever_slot_order(model, sampler):
  prompts = prompts_of(5, seed=2)
  kw = dict(group_size=3, max_new_tokens=20, temperature=1.0, seed=7, eos_ids=EOS)
  a = sampler.sample_groups(prompts, **kw)
  b = sampler.sample_groups(prompts, **kw)
  for f in ("tokens", "logprobs", "lengths", "truncated"):
    np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
  # 3 slots and 5-step calls: samples run in other slots, finish in another order.
  other = make_sampler(model, num_slots=3, max_prompt_len=P_LEN, max_len=MAX_LEN,
                       steps_per_call=5)
  c = other.sample_groups(prompts, **kw)
  np.testing.assert_array_equal(a.tokens, c.tokens)
  np.testing.assert_array_equal(a.lengths, c.lengths)
  np.testing.assert_allclose(a.logprobs, c.logprobs, atol=1e-5)
  assert len(set(a.lengths.ravel())) > 1  # finishing order really differed
  d = sampler.sample_groups(prompts, **{**kw, "seed": 8})
  assert not np.array_equal(a.tokens, d.tokens)


def test_prefix_fan_out_prefills_each_prompt_once(sampler, monkeypatch):
  rows = []
  real = sampler.engine.prefill_batch

  def spy(params, tokens, lengths):
    rows.extend(tuple(t[:n]) for t, n in zip(tokens.tolist(), lengths.tolist()))
    return real(params, tokens, lengths)

  monkeypatch.setattr(sampler.engine, "prefill_batch", spy)
  prompts = prompts_of(5, seed=4)
  r = sampler.sample_groups(prompts, group_size=4, max_new_tokens=6, seed=0)
  real_rows = [x for x in rows if x in {tuple(p) for p in prompts}]
  assert sorted(real_rows) == sorted(tuple(p) for p in prompts)  # once each, never G times
  s = r.stats
  lens = [len(p) for p in prompts]
  assert s["prefills"] == 5 and s["inserts"] == 20
  assert s["prefill_tokens_saved"] == 3 * sum(lens)
  assert s["prefill_flops_saved"] == 3 * sum(flops.prefill_flops(CFG, n) for n in lens)


def _ideal_makespan(lengths, slots):
  """Decode steps of a refill-at-once scheduler that takes samples in order."""
  free_at = [0] * slots
  for ln in lengths:
    i = int(np.argmin(free_at))
    free_at[i] += ln
  return max(free_at)


def test_continuous_batching_utilisation(model, capsys):
  # 16 samples whose lengths are set by the cache limit: response = max_len - prompt length.
  want = [2, 30, 5, 61, 3, 12, 44, 1, 7, 25, 58, 4, 16, 9, 37, 20]
  max_len = 64
  prompts = [[5 + (k % 50)] * (max_len - w) for k, w in enumerate(want)]
  s4 = make_sampler(model, num_slots=4, max_prompt_len=63, max_len=max_len, steps_per_call=16)
  r = s4.sample_groups(prompts, group_size=1, max_new_tokens=64, seed=0)
  np.testing.assert_array_equal(r.lengths[:, 0], want)
  steps, total = r.stats["decode_steps"], sum(want)
  ideal = _ideal_makespan(want, 4)
  static = sum(max(want[i:i + 4]) for i in range(0, 16, 4))  # 4 batches of 4, padded
  with capsys.disabled():
    print(f"\n[continuous batching] 4 slots, 16 samples, sum(lengths)={total}: "
          f"decode steps {steps} (sum/slots = {total / 4:.1f}, refill-at-once optimum {ideal}, "
          f"static batches {static}, groups x max length {16 * max(want)}); "
          f"slot utilisation {r.stats['slot_utilisation']:.3f}")
  assert steps == ideal  # a finished slot never idles while samples wait
  assert r.stats["slot_utilisation"] == pytest.approx(total / (4 * steps))
  assert steps < 0.75 * static


def test_sampling_parameters_shape_first_token_distribution(model, sampler):
  prompt = prompts_of(1, seed=11)[0]
  logits, _ = model.prefill(jnp.asarray([prompt]), jnp.asarray([len(prompt)]))
  logits = np.asarray(logits[0], np.float64)
  n_prompts, g = 96, 8

  def first_tokens(**kw):
    r = sampler.sample_groups([prompt] * n_prompts, group_size=g, max_new_tokens=1, seed=3, **kw)
    return r.tokens[:, :, 0].ravel()

  def check(tokens, q):
    f = np.bincount(tokens, minlength=q.size) / tokens.size
    assert np.all(f[q == 0] == 0)
    assert np.all(np.abs(f - q) <= 5 * np.sqrt(q * (1 - q) / tokens.size) + 2e-3)

  def softmax(x):
    e = np.exp(x - x.max())
    return e / e.sum()

  for t in (0.5, 1.5):
    check(first_tokens(temperature=t), softmax(logits / t))
  order = np.argsort(-logits)
  q = np.zeros_like(logits)
  q[order[:3]] = softmax(logits[order[:3]])
  check(first_tokens(top_k=3), q)
  p = softmax(logits)
  before = np.cumsum(p[order]) - p[order]
  nucleus = order[before < 0.6]
  q = np.zeros_like(p)
  q[nucleus] = p[nucleus] / p[nucleus].sum()
  check(first_tokens(top_p=0.6), q)


@pytest.mark.parametrize("axes", [{"data": 8}, {"data": 4, "tensor": 2},
                                  {"data": 2, "fsdp": 2, "tensor": 2}])
def test_mesh_equals_single_device(model, sampler, axes):
  mesh = sharding.make_mesh(axes)
  sharded = make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN, mesh=mesh)
  prompts = prompts_of(4, seed=6)
  kw = dict(group_size=4, max_new_tokens=16, temperature=1.0, seed=2, eos_ids=EOS)
  a, b = sampler.sample_groups(prompts, **kw), sharded.sample_groups(prompts, **kw)
  np.testing.assert_array_equal(a.tokens, b.tokens)
  # Tensor-parallel sums add in another order: float32 noise, same tolerance as the log-probs.
  np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-4)
  cache = sharded.engine.init_decode_state().cache["k"]
  assert cache.sharding.spec[1] is not None  # slots really split over the batch axes


def test_update_params_reshards_without_recompiling(model):
  s = make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN,
                   mesh=sharding.make_mesh({"data": 4, "tensor": 2}))
  prompts = prompts_of(3, seed=8)
  kw = dict(group_size=2, max_new_tokens=10, temperature=1.0, seed=4, eos_ids=EOS)
  before = s.sample_groups(prompts, **kw)
  eng = s.engine
  jitted = (eng._jit_prefill, eng._jit_insert, eng._jit_chunk, eng._jit_init)
  sizes = [f._cache_size() for f in jitted]
  # The trainer's params: another model, on a different (fsdp) mesh.
  new = tiny_model(seed=1)
  train_mesh = sharding.make_mesh({"fsdp": 8})
  shardings = nnx.filter_state(sharding.model_shardings(new, train_mesh), nnx.Param)
  trainer_params = jax.device_put(nnx.state(new, nnx.Param), shardings)
  s.update_params(trainer_params)
  s.sample_groups(prompts, **kw)  # with the new params: must not recompile
  assert [f._cache_size() for f in jitted] == sizes
  leaf = jax.tree.leaves(eng.params)[0]
  assert leaf.sharding.mesh == eng.mesh
  fresh = make_sampler(new, num_slots=8, max_prompt_len=P_LEN, max_len=MAX_LEN)
  # The samplers own copies: deleting the trainer's buffers (as jit donation does) is harmless.
  jax.tree.map(lambda a: a.delete(), (trainer_params, nnx.state(new, nnx.Param)))
  expect = fresh.sample_groups(prompts, **kw)
  after = s.sample_groups(prompts, **kw)
  np.testing.assert_array_equal(after.tokens, expect.tokens)
  np.testing.assert_allclose(after.logprobs, expect.logprobs, atol=1e-4)
  assert not np.array_equal(before.tokens, after.tokens)


def test_update_params_takes_pure_dicts_and_casts(model):
  s = make_sampler(model, num_slots=2, max_prompt_len=P_LEN, max_len=MAX_LEN)
  new = nnx.to_pure_dict(nnx.state(tiny_model(seed=2), nnx.Param))
  s.update_params(jax.tree.map(lambda x: x.astype(jnp.bfloat16), new))
  got = nnx.to_pure_dict(s.engine.params)
  assert got["embed"].dtype == jnp.float32  # the engine keeps its dtype
  np.testing.assert_array_equal(np.asarray(got["embed"]),
                                np.asarray(new["embed"].astype(jnp.bfloat16), np.float32))


def test_update_params_rejects_mismatched_params(sampler):
  params = nnx.state(tiny_model(), nnx.Param)
  bad_shape = jax.tree.map(lambda x: x, params)
  bad_shape["embed"].set_value(jnp.zeros((65, CFG.hidden_size)))
  with pytest.raises(ValueError, match=r"embed.*shape \(65, 32\)"):
    sampler.update_params(bad_shape)
  other = Qwen2(ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                            num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=False),
                rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="params: tree does not match.*missing.*bq"):
    sampler.update_params(nnx.state(other, nnx.Param))


@pytest.mark.parametrize("prompts,kw,match", [
    ([list(range(4, 4 + P_LEN + 1))], {}, r"prompts\[0\]: 17 tokens exceed max_prompt_len=16"),
    ([[5, 6]], {"group_size": 9}, "group_size: 9 exceeds num_slots=8"),
    ([], {}, "prompts: empty list"),
    ([[5], []], {}, r"prompts\[1\]: empty prompt"),
    ([[5, 64]], {}, r"prompts\[0\]: token id 64 outside the vocabulary"),
    ([[5, -1]], {}, r"prompts\[0\]: token id -1"),
    ([[5.5]], {}, r"prompts\[0\]: expected a flat list of int"),
    ("abc", {}, "prompts: expected a list"),
    ([[5]], {"group_size": 0}, "group_size"),
    ([[5]], {"max_new_tokens": 0}, "max_new_tokens"),
    ([[5]], {"temperature": -1.0}, "temperature"),
    ([[5]], {"top_p": 0.0}, "top_p"),
    ([[5]], {"top_p": 1.01}, "top_p"),
    ([[5]], {"top_k": -2}, "top_k"),
    ([[5]], {"seed": -3}, "seed"),
    ([[5]], {"eos_ids": (64,)}, "eos_ids"),
])
def test_bad_inputs(sampler, prompts, kw, match):
  args = dict(group_size=2, max_new_tokens=4)
  args.update(kw)
  with pytest.raises(ValueError, match=match):
    sampler.sample_groups(prompts, **args)


@pytest.mark.parametrize("kw,match", [
    (dict(num_slots=0, max_prompt_len=8, max_len=16), "num_slots"),
    (dict(num_slots=2, max_prompt_len=16, max_len=16), "max_len: must exceed max_prompt_len"),
    (dict(num_slots=2, max_prompt_len=0, max_len=16), "max_prompt_len"),
    (dict(num_slots=2, max_prompt_len=8, max_len=40_000), "max_position_embeddings"),
    (dict(num_slots=2, max_prompt_len=8, max_len=16, steps_per_call=0), "steps_per_call"),
])
def test_bad_construction(model, kw, match):
  with pytest.raises(ValueError, match=match):
    make_sampler(model, **kw)
