"""Tests for dapo_jax.data.pipeline: exact resume, epochs, multi-host shards, truncation."""
import json

import numpy as np
import pytest

from dapo_jax.data import readers
from dapo_jax.data import tokenizer as tok_lib
from dapo_jax.data.pipeline import PromptIterator, encode_prompt, stop_token_ids
from dapo_jax.data.synthetic import SyntheticTask


@pytest.fixture(scope="module")
def tok():
  return tok_lib.load_tokenizer()


@pytest.fixture(scope="module")
def examples():
  return SyntheticTask(3, seed=0).examples("train", 37)


def _key(batch):
  return batch.step, batch.epoch, batch.ids, batch.prompt_ids, batch.truncated_B.tolist()


def test_resume_is_exact(examples, tok):
  ref = PromptIterator(examples, tok, batch_size=8, seed=3, max_prompt_len=60)
  want = [_key(next(ref)) for _ in range(12)]  # 4 batches per epoch: crosses 2 epoch boundaries
  for k in (0, 3, 4, 7):
    it = PromptIterator(examples, tok, batch_size=8, seed=3, max_prompt_len=60)
    got = [_key(next(it)) for _ in range(k)]
    state = json.loads(json.dumps(it.state()))  # must survive a JSON checkpoint
    resumed = PromptIterator(examples, tok, batch_size=8, seed=3, max_prompt_len=60)
    resumed.restore(state)
    got += [_key(next(resumed)) for _ in range(12 - k)]
    assert got == want, k
    assert resumed.num_prompts == 8 * 12 and resumed.num_truncated == ref.num_truncated


def test_epochs_cover_distinct_examples_in_new_orders(examples, tok):
  it = PromptIterator(examples, tok, batch_size=8, seed=0, num_epochs=3)
  batches = list(it)
  assert len(batches) == 3 * (37 // 8) == 3 * it.batches_per_epoch
  orders = []
  for epoch in range(3):
    ids = [i for b in batches if b.epoch == epoch for i in b.ids]
    assert len(ids) == len(set(ids)) == 32  # the 5 left over are dropped this epoch
    orders.append(ids)
  assert orders[0] != orders[1] != orders[2]
  same_seed = [b.ids for b in PromptIterator(examples, tok, batch_size=8, seed=0, num_epochs=3)]
  assert same_seed == [b.ids for b in batches]
  other_seed = [b.ids for b in PromptIterator(examples, tok, batch_size=8, seed=1, num_epochs=3)]
  assert other_seed != same_seed
  in_order = PromptIterator(examples, tok, batch_size=8, shuffle=False, num_epochs=1)
  assert [i for b in in_order for i in b.ids] == [e.id for e in examples[:32]]


@pytest.mark.parametrize("num_shards", [2, 4])
def test_shards_concatenate_to_the_single_host_batch(examples, tok, num_shards):
  one = PromptIterator(examples, tok, batch_size=8, seed=5)
  hosts = [PromptIterator(examples, tok, batch_size=8, seed=5, shard_index=i,
                          num_shards=num_shards) for i in range(num_shards)]
  for _ in range(6):
    want = next(one)
    parts = [next(h) for h in hosts]
    assert all(len(p.ids) == 8 // num_shards for p in parts)
    assert sum((p.ids for p in parts), []) == want.ids
    assert sum((p.prompt_ids for p in parts), []) == want.prompt_ids
  # A state saved on 1 host resumes on num_shards hosts at the same global step.
  for i, h in enumerate(hosts):
    h2 = PromptIterator(examples, tok, batch_size=8, seed=5, shard_index=i, num_shards=num_shards)
    h2.restore(one.state())
    assert next(h2).ids == next(h).ids


def test_left_truncation_and_counts(tok):
  exs = [SyntheticTask(d, seed=0).examples("train", 1)[0] for d in (1, 4, 8, 12)]
  full = [tok.encode(e.prompt) for e in exs]
  limit = sorted(len(f) for f in full)[1]  # two prompts fit, two are longer
  it = PromptIterator(exs, tok, batch_size=4, shuffle=False, max_prompt_len=limit)
  batch = next(it)
  for f, got, cut, n in zip(full, batch.prompt_ids, batch.truncated_B, batch.lengths_B):
    assert got == f[-limit:] and n == len(got) == min(len(f), limit)
    assert cut == (len(f) > limit)
  assert it.num_truncated == 2 and it.state()["num_truncated"] == 2
  # The answer-asking end of the prompt survives a left cut.
  assert tok.decode(batch.prompt_ids[3]).endswith(exs[3].problem + "\n\nRemember to put your "
                                                  "answer on its own line after \"Answer:\".")


def test_padded(examples, tok):
  batch = next(PromptIterator(examples, tok, batch_size=4, seed=0))
  tokens_BxL, mask_BxL = batch.padded(tok.pad_token_id)
  assert tokens_BxL.shape == (4, batch.lengths_B.max()) and tokens_BxL.dtype == np.int32
  np.testing.assert_array_equal(mask_BxL.sum(1), batch.lengths_B)
  for b in range(4):
    assert tokens_BxL[b][mask_BxL[b]].tolist() == batch.prompt_ids[b]
    assert mask_BxL[b, -1]  # left padding: every prompt ends at the last column
  right_BxL, rmask_BxL = batch.padded(tok.pad_token_id, length=90, side="right")
  assert right_BxL.shape == (4, 90) and rmask_BxL[:, 0].all()
  assert (right_BxL[~rmask_BxL] == tok.pad_token_id).all()
  with pytest.raises(ValueError, match="length: 3 is shorter than the longest prompt"):
    batch.padded(0, length=3)
  with pytest.raises(ValueError, match="side:"):
    batch.padded(0, side="middle")


def test_real_data_and_chat_template(tok):
  exs, _ = readers.load_examples("aime_2024")
  chat_tok = tok_lib.load_tokenizer()
  chat_tok.chat_template = "<|user|>{{ messages[0]['content'] }}<|assistant|>"
  plain = next(PromptIterator(exs, tok, batch_size=10, seed=0, max_prompt_len=2048))
  chat = next(PromptIterator(exs, chat_tok, batch_size=10, seed=0, max_prompt_len=2048,
                             use_chat_template=True))
  assert plain.ids == chat.ids and plain.answers == [e.answer for e in plain.examples]
  head = tok.encode("<|user|>", add_special_tokens=False)
  tail = tok.encode("<|assistant|>", add_special_tokens=False)
  for p, c in zip(plain.prompt_ids, chat.prompt_ids):
    assert p[0] == tok.bos_token_id  # plain path: the tokenizer's own special tokens
    assert c == head + p[1:] + tail  # chat path: only what the template writes


CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + "
          "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}"
          "{{ '<|im_start|>assistant\\n' }}{% endif %}")


@pytest.fixture()
def chatml_tok():
  t = tok_lib.load_tokenizer()
  t.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
  t.chat_template = CHATML
  return t


def test_chat_template_prompt_and_stop_tokens(chatml_tok, tok):
  t = chatml_tok
  start, end = t.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"])
  ids = encode_prompt(t, "Compute 3+4.", use_chat_template=True)
  body = t.encode("user\nCompute 3+4.", add_special_tokens=False)
  tail = t.encode("\n", add_special_tokens=False)
  asst = t.encode("assistant\n", add_special_tokens=False)
  # One user message, then the generation prompt; no BOS of the tokenizer's own.
  assert ids == [start] + body + [end] + tail + [start] + asst
  assert stop_token_ids(t, use_chat_template=True) == (end, t.eos_token_id)
  assert stop_token_ids(t, use_chat_template=False) == (t.eos_token_id,)
  # A template that ends turns with plain text has no end-of-turn token: EOS alone.
  t.chat_template = "{% for m in messages %}{{ m['content'] + '\\n' }}{% endfor %}"
  assert stop_token_ids(t, use_chat_template=True) == (t.eos_token_id,)
  for call in (lambda: encode_prompt(tok, "x", use_chat_template=True),
               lambda: stop_token_ids(tok, use_chat_template=True)):
    with pytest.raises(ValueError, match="task.chat_template is on but the tokenizer .* has no"):
      call()


def test_bad_arguments_and_states(examples, tok):
  cases = [({"batch_size": 6, "num_shards": 4}, "batch_size: 6 is not divisible"),
           ({"batch_size": 38}, "batch_size: 38 exceeds the number of examples"),
           ({"batch_size": 4, "shard_index": 2, "num_shards": 2}, "shard_index:"),
           ({"batch_size": 0}, "batch_size: expected an int >= 1"),
           ({"batch_size": 4, "max_prompt_len": 0}, "max_prompt_len:"),
           ({"batch_size": 4, "seed": -1}, "seed:"),
           ({"batch_size": 4, "use_chat_template": True}, "task.chat_template is on but the tokenizer")]
  for kwargs, message in cases:
    with pytest.raises(ValueError, match=message):
      PromptIterator(examples, tok, **kwargs)
  with pytest.raises(ValueError, match="examples: expected a non-empty list"):
    PromptIterator([], tok, batch_size=1)
  it = PromptIterator(examples, tok, batch_size=4, seed=0)
  state = it.state()
  for key, value, message in [("seed", 1, "state: seed is 1 in the saved state but 0 here"),
                              ("fingerprint", "x", "state: fingerprint"),
                              ("step", -1, "state\\['step'\\]: expected an int >= 0")]:
    with pytest.raises(ValueError, match=message):
      it.restore({**state, key: value})
  with pytest.raises(ValueError, match="missing keys \\['step'\\]"):
    it.restore({k: v for k, v in state.items() if k != "step"})
  other = PromptIterator(examples[1:], tok, batch_size=4, seed=0)
  with pytest.raises(ValueError, match="num_examples"):
    other.restore(state)
