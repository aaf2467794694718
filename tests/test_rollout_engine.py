"""The JetStream Engine API of the rollout engine, driven step by step as JetStream does."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jetstream.engine import engine_api

from dapo_jax.data.tokenizer import SYNTHETIC_TOKENIZER_DIR
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout import sampling
from dapo_jax.rollout import tokenizer as tokenizer_lib
from dapo_jax.rollout.engine import Engine

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
SLOTS, P_LEN, MAX_LEN = 4, 16, 40


def tiny_model(seed: int = 0) -> Qwen2:
  """Weights scaled up so greedy tokens depend clearly on the context (see test_rollout_sampler)."""
  m = Qwen2(CFG, rngs=nnx.Rngs(seed))
  nnx.update(m, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, nnx.state(m, nnx.Param)))
  m.lm_head.set_value(m.lm_head.get_value() * 8.0)
  return m


@pytest.fixture(scope="module")
def model():
  return tiny_model()


@pytest.fixture(scope="module")
def engine(model):
  return Engine(model, num_slots=SLOTS, max_prompt_len=P_LEN, max_len=MAX_LEN,
                sampling_params=sampling.SamplingParams(temperature=0.0, eos_ids=(3,)), bos_id=1)


def greedy_reference(model, prompt, steps):
  """Greedy decode by full forward passes (no KV cache)."""
  graphdef, state = nnx.split(model)
  fwd = jax.jit(lambda st, x, m: nnx.merge(graphdef, st)(x, m))
  seq = np.zeros((1, len(prompt) + steps), np.int32)
  seq[0, :len(prompt)] = prompt
  n = len(prompt)
  for _ in range(steps):
    mask = (np.arange(seq.shape[1]) < n)[None].astype(np.int32)
    seq[0, n] = int(np.argmax(np.asarray(fwd(state, jnp.asarray(seq), jnp.asarray(mask)))[0, n - 1]))
    n += 1
  return seq[0, len(prompt):].tolist()


def _padded(prompt):
  return jnp.asarray(prompt + [0] * (P_LEN - len(prompt)), jnp.int32)


def test_is_a_jetstream_engine(engine):
  assert isinstance(engine, engine_api.Engine)
  assert engine.max_concurrent_decodes == SLOTS and engine.samples_per_slot == 1
  assert engine.max_prefill_length == P_LEN and engine.colocated_cpus is None
  assert isinstance(engine.mesh, jax.sharding.Mesh)
  prefix = engine.prefill(params=engine.load_params(), padded_tokens=_padded([5, 6]),
                          true_length=2)
  moved = jax.device_put(prefix, engine.get_prefix_destination_sharding())
  assert jax.tree.structure(moved) == jax.tree.structure(prefix)


def test_prefill_insert_generate_is_greedy_with_refills(model, engine):
  """JetStream's loop: prefill, insert into a slot, generate; a slot is refilled mid-run and the
  new request is unaffected by what the slot held before; free slots report invalid tokens."""
  params = engine.load_params()
  prompts = {2: [5, 9, 11], 0: [7, 8, 9, 10, 12, 13, 4]}
  later = [20, 21, 22, 23, 24]
  steps = 10
  state = engine.init_decode_state()
  for slot, p in prompts.items():
    prefix = engine.prefill(params=params, padded_tokens=_padded(p), true_length=len(p))
    state = engine.insert(prefix, state, slot)
  got = {0: [], 2: [], "later": []}
  for step in range(2 * steps):
    if step == steps:  # slot 2 finished its 10 tokens: refill it with a new request
      prefix = engine.prefill(params=params, padded_tokens=_padded(later), true_length=len(later))
      state = engine.insert(prefix, state, 2)
    state, result = engine.generate(params, state)
    result = result.convert_to_numpy()
    for slot in (0, 2):
      data = result.get_result_at_slot(slot)
      key = "later" if (slot == 2 and step >= steps) else slot
      if data.valid[0, 0]:
        got[key].append(int(data.tokens[0, 0]))
    for free in (1, 3):
      assert result.get_result_at_slot(free).valid[0, 0] == 0
  ref0 = greedy_reference(model, prompts[0], 2 * steps)
  ref2 = greedy_reference(model, prompts[2], steps)
  ref_later = greedy_reference(model, later, steps)

  def upto_eos(ref):  # the engine's serving EOS (3) ends a request, EOS included
    return ref[:ref.index(3) + 1] if 3 in ref else ref

  assert got[0] == upto_eos(ref0)
  assert got[2] == upto_eos(ref2)
  assert got["later"] == upto_eos(ref_later)


def _cache_sizes(engine):
  # jax.jit caches are shared by every wrapper of the same function (other engines built by
  # other tests count too), so the checks below are on growth, not absolute sizes.
  return (engine._jit_prefill._cache_size(), engine._jit_insert._cache_size(),
          engine._jit_result_step._cache_size())


def test_no_recompilation_on_refill_or_new_params(engine):
  params = engine.load_params()
  state = engine.init_decode_state()
  before = _cache_sizes(engine)
  for slot in range(SLOTS):
    prefix = engine.prefill(params=params, padded_tokens=_padded([5 + slot] * (slot + 1)),
                            true_length=slot + 1)
    state = engine.insert(prefix, state, slot)
    state, _ = engine.generate(params, state)
  sizes = _cache_sizes(engine)
  assert all(s - b <= 1 for s, b in zip(sizes, before)), (before, sizes)  # one compile at most
  new_params = engine.load_params(nnx.state(tiny_model(seed=3), nnx.Param))
  prefix = engine.prefill(params=new_params, padded_tokens=_padded([9]), true_length=1)
  state = engine.insert(prefix, state, 1)
  state, _ = engine.generate(new_params, state)
  assert _cache_sizes(engine) == sizes  # new params, a refilled slot: nothing recompiled
  engine.load_params(params)


def test_engine_bad_inputs(engine):
  params = engine.load_params()
  with pytest.raises(NotImplementedError, match="existing_prefix"):
    engine.prefill(params=params, existing_prefix=object(), padded_tokens=_padded([5]),
                   true_length=1)
  with pytest.raises(ValueError, match="true_length"):
    engine.prefill(params=params, padded_tokens=jnp.zeros((32,), jnp.int32), true_length=20)
  with pytest.raises(ValueError, match="true_length"):
    engine.prefill(params=params, padded_tokens=_padded([5]), true_length=0)
  prefix = engine.prefill(params=params, padded_tokens=_padded([5]), true_length=1)
  with pytest.raises(ValueError, match="slot: 4 not in"):
    engine.insert(prefix, engine.init_decode_state(), SLOTS)
  with pytest.raises(ValueError, match="top_p"):
    engine.init_decode_state(sampling.SamplingParams(top_p=2.0))


def test_tokenizer_hooks(model):
  ids_only = Engine(model, num_slots=2, max_prompt_len=P_LEN, max_len=MAX_LEN, bos_id=1,
                    sampling_params=sampling.SamplingParams(eos_ids=(3, 4)))
  tok = ids_only.build_tokenizer(ids_only.get_tokenizer())
  assert isinstance(tok, tokenizer_lib.TokenIdTokenizer)
  assert tok.bos_id == 1 and tok.stop_tokens == {3, 4}
  with pytest.raises(ValueError, match="token_content"):
    tok.encode("hello")
  with pytest.raises(ValueError, match="bos_id"):
    tokenizer_lib.build("", eos_ids=(), bos_id=None, pad_id=0)
  hf = Engine(model, num_slots=2, max_prompt_len=P_LEN, max_len=MAX_LEN,
              tokenizer_path=str(SYNTHETIC_TOKENIZER_DIR))
  tok = hf.build_tokenizer(hf.get_tokenizer())
  assert isinstance(tok, tokenizer_lib.HFTokenizer)
  padded, n = tok.encode("1+2=", max_prefill_length=P_LEN, jax_padding=False)
  assert n == 5 and padded.shape == (P_LEN,) and padded[0] == tok.bos_id == 1
  assert tok.decode(padded[1:n].tolist()) == "1+2="
  assert tok.eos_id in tok.stop_tokens
