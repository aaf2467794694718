"""rewards/reflection cases its own tests leave open, found by mutation testing (docs/testing.md).

A response with no stated answer, integer verdict arrays, the trainer's step_metrics entry point
with phrases on, and the empty-phrase error text.
"""
import numpy as np
import pytest

from dapo_jax.rewards import math_answer, reflection
from dapo_jax.train.groups import Groups

PHRASES = ("wait", "let me check")


def test_response_without_an_answer_has_no_change():
  pat = reflection.phrase_pattern(PHRASES)
  flags = reflection.response_flags("wait, no idea", "3", pattern=pat,
                                    reward_fn=math_answer.score)
  assert flags == {"reflects": True, "changed": False, "right_to_wrong": False,
                   "wrong_to_right": False}


def test_integer_verdicts_are_booleans():
  # correct as 0/1 integers (a jax int array brought to host) must mask, not index.
  texts = ["wait\nAnswer: 3", "Answer: 3", "Answer: 4"]
  as_bool = reflection.batch_metrics(texts, ["3", "3", "3"], [True, True, False],
                                     phrases=PHRASES, reward_fn=math_answer.score)
  as_int = reflection.batch_metrics(texts, ["3", "3", "3"], np.array([1, 1, 0]),
                                    phrases=PHRASES, reward_fn=math_answer.score)
  assert as_int == as_bool
  assert as_bool["reflect_frac_correct"] == 0.5 and as_bool["reflect_frac_wrong"] == 0.0


def test_step_metrics_with_phrases_is_groups_metrics():
  texts = {1: "Answer: 3", 2: "Let me check.\nAnswer: 3"}
  g = Groups(prompts=[[9]], answers=["3"], tokens=np.array([[[1], [2]]], np.int32),
             behav_logp=np.zeros((1, 2, 1), np.float32), versions=np.zeros((1, 2, 1), np.int32),
             lengths=np.ones((1, 2), np.int32),
             truncated=np.zeros((1, 2), bool), correct=np.array([[True, True]]),
             parsed=np.ones((1, 2), bool),
             score=np.ones((1, 2), np.float32), reward=np.ones((1, 2), np.float32))
  decode = lambda rows: [texts[r[0]] for r in rows]
  got = reflection.step_metrics(g, spec="wait, let me check", decode=decode,
                                reward_fn=math_answer.score)
  assert got == reflection.groups_metrics(g, decode=decode, phrases=PHRASES,
                                          reward_fn=math_answer.score)
  assert got["reflect_frac"] == 0.5 and got["answer_change_frac"] == 0.0


def test_empty_phrases_message():
  with pytest.raises(ValueError, match="^phrases: need at least one phrase$"):
    reflection.phrase_pattern(())


def test_trajectory_of_three_answers_in_order():
  text = "Answer: 1\nhmm\nAnswer: 2\nwait\nAnswer: 3"
  assert reflection.answer_trajectory(text, "2", math_answer.score) == [
      ("1", False), ("2", True), ("3", False)]
