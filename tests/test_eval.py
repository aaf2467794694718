import math

import numpy as np
import pytest

from dapo_jax import eval as eval_lib


def test_pass_at_k_unbiased_values():
  assert eval_lib.pass_at_k(4, 0, 2) == 0.0
  assert eval_lib.pass_at_k(4, 4, 1) == 1.0
  assert eval_lib.pass_at_k(4, 1, 1) == pytest.approx(0.25)
  # 1 - C(3,2)/C(5,2) = 1 - 3/10
  assert eval_lib.pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
  with pytest.raises(ValueError, match="k"):
    eval_lib.pass_at_k(4, 1, 5)
  with pytest.raises(ValueError, match="c"):
    eval_lib.pass_at_k(4, 5, 1)


def test_majority_vote_uses_the_verifiers_verdicts():
  # The winner is the most frequent extracted answer; it is right iff the verifier judged a
  # sample with that answer correct (whatever the reward function is).
  assert eval_lib.majority_correct(["12", "12", "7", None], [True, True, False, False])
  assert not eval_lib.majority_correct(["7", "7", "12"], [False, False, True])
  assert eval_lib.majority_correct(["12", "7"], [True, False])  # tie: first seen wins
  assert not eval_lib.majority_correct(["7", "12"], [False, True])  # tie: first seen wins
  assert not eval_lib.majority_correct([None, None], [False, False])
  with pytest.raises(ValueError, match="2 predictions vs 1"):
    eval_lib.majority_correct(["1", "2"], [True])


def test_majority_vote_honours_a_non_math_reward():
  # A reward whose extracted answers are words: maj@k must not route them through math_answer.
  preds = ["cat", "cat", "dog"]
  assert eval_lib.majority_correct(preds, [True, True, False])
  s = eval_lib.summarize(np.array([[1, 1, 0]], bool), [preds], bootstrap_samples=0)
  assert s["maj@3"] == 1.0


def test_summarize_and_ci():
  correct = np.array([[1, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
  preds = [["5", "4", "4", "4"], ["1"] * 4, ["9"] * 4]
  s = eval_lib.summarize(correct, preds, bootstrap_samples=500)
  assert s["avg@4"] == pytest.approx((0.25 + 1 + 0) / 3)
  assert s["pass@4"] == pytest.approx(2 / 3)
  assert s["maj@4"] == pytest.approx(1 / 3)
  assert s["avg@4_ci_lo"] <= s["avg@4"] <= s["avg@4_ci_hi"]
  assert s["all_correct_frac"] == pytest.approx(1 / 3)
  lo, hi = eval_lib.bootstrap_ci(np.ones(10), samples=100)
  assert lo == hi == 1.0


class _FixedSampler:
  """sample_groups returns fixed responses: token t decodes to TEXTS[t]."""
  TEXTS = {1: "3 + 4 = 7\nAnswer: 7", 2: "it is seven", 3: "Answer: 8"}

  def __init__(self, tokens_NxG):
    self.tokens = np.asarray(tokens_NxG, np.int32)[..., None]

  def sample_groups(self, prompts, *, group_size, **unused):
    assert self.tokens.shape[:2] == (len(prompts), group_size)
    n, g = self.tokens.shape[:2]
    return type("R", (), {"tokens": self.tokens, "lengths": np.ones((n, g), np.int32),
                          "truncated": np.zeros((n, g), bool)})


def test_evaluate_format_rate_and_shown_responses():
  from dapo_jax import rewards
  sampler = _FixedSampler([[1, 2], [3, 2], [2, 2]])  # parsed: 1, 0 / 1, 0 / 0, 0
  out = eval_lib.evaluate(
      sampler, [[5], [6], [7]], ["7", "7", "1"], k=2, temperature=1.0, top_p=1.0,
      max_new_tokens=1, seed=0, decode=lambda rows: [_FixedSampler.TEXTS[r[0]] for r in rows],
      reward_fn=rewards.get_reward_fn("math_answer"), eos_ids=(0,), bootstrap_samples=0,
      num_shown=2)
  assert out["format_rate"] == pytest.approx(2 / 6)
  assert out["avg@2"] == pytest.approx(1 / 6) and out["all_correct_frac"] == 0.0
  assert out["shown"] == [
      {"problem": 0, "answer": "7", "pred": "7", "correct": True,
       "response": "3 + 4 = 7\nAnswer: 7"},
      {"problem": 1, "answer": "7", "pred": "8", "correct": False, "response": "Answer: 8"}]
