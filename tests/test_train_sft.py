import numpy as np
import pytest
from flax import nnx

from dapo_jax.data import synthetic
from dapo_jax.data import tokenizer as tokenizer_lib
from dapo_jax.data.pipeline import PromptIterator
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rewards import math_answer
from dapo_jax.train import setup, sft


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer()


def test_warm_start_prompts_match_the_rl_prompt_ids(tok):
  """The warm start must see prompts exactly as sampling does (BOS included): a position shift
  between the two cost the shipped base most of its accuracy once."""
  ex = synthetic.SyntheticTask(difficulty=3).examples("train", 4)
  it = PromptIterator(ex, tok, batch_size=4, shuffle=False)
  batch = next(it)
  seqs = sft.sequences(ex, tok, seq_len=128, eos_id=tok.eos_token_id)
  for i, ids in enumerate(batch.prompt_ids):
    P = len(ids)
    np.testing.assert_array_equal(seqs["tokens"][i, :P], ids)
    assert seqs["loss_mask"][i, :P].sum() == 0 and seqs["loss_mask"][i, P] == 1
    resp = seqs["tokens"][i][seqs["loss_mask"][i] > 0].tolist()
    assert resp[-1] == tok.eos_token_id


def test_decoded_response_with_eos_scores_right(tok):
  ex = synthetic.SyntheticTask(difficulty=3).examples("train", 1)[0]
  ids = tok.encode(ex.solution, add_special_tokens=False) + [tok.eos_token_id]
  task = setup.Task(train=[], eval=[], tokenizer=tok, eos_ids=(tok.eos_token_id,))
  text = task.decode([ids])[0]
  assert math_answer.score(text, ex.answer)[1], text
  assert not math_answer.score(tok.decode(ids), ex.answer)[1]  # why decode drops specials


def test_warm_start_lowers_nll_and_rejects_bad_rows(tok):
  ex = synthetic.SyntheticTask(difficulty=2, digits=2).examples("train", 64)
  cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
  graphdef, params = nnx.split(Qwen2(cfg, rngs=nnx.Rngs(0)))
  _, losses = sft.warm_start(graphdef, params, ex, tok, steps=20, batch_size=8, lr=3e-3,
                             seq_len=128, eos_id=tok.eos_token_id, seed=0, log_every=10)
  assert losses[-1] < losses[0]
  bad = [ex[0].__class__(**{**ex[0].__dict__, "solution": None})]
  with pytest.raises(ValueError, match="no reference solution"):
    sft.sequences(bad, tok, seq_len=128, eos_id=2)
  with pytest.raises(ValueError, match="needs"):
    sft.sequences(ex[:1], tok, seq_len=16, eos_id=2)
