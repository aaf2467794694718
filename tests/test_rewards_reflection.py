"""rewards/reflection: phrase parsing and matching, answer trajectories, hand-counted metrics."""
import math

import numpy as np
import pytest

from dapo_jax.rewards import math_answer, reflection
from dapo_jax.train.groups import Groups

PHRASES = ("wait", "let me check", "double-check")


def test_parse_phrases():
  assert reflection.parse_phrases("") == () and reflection.parse_phrases("  ") == ()
  assert reflection.parse_phrases("Wait, let me check ") == ("wait", "let me check")
  with pytest.raises(ValueError, match="config.log.reflection_phrases: empty phrase"):
    reflection.parse_phrases("wait,,check")
  with pytest.raises(ValueError, match="comma-separated string"):
    reflection.parse_phrases(["wait"])


def test_pattern_matches_whole_words_only():
  pat = reflection.phrase_pattern(PHRASES)
  assert pat.search("Hmm, WAIT. that is off")
  assert pat.search("Let me   check".replace("   ", " "))
  assert pat.search("I'll double-check it")
  assert not pat.search("await the result; waiting")
  with pytest.raises(ValueError, match="at least one"):
    reflection.phrase_pattern(())


def test_answer_trajectory_reads_each_answer_as_the_verifier_would():
  text = "2+2=5\nAnswer: 5\nWait, let me check: 2+2=4\nAnswer: 4"
  assert reflection.answer_trajectory(text, "4", math_answer.score) == [("5", False), ("4", True)]
  assert reflection.answer_trajectory(r"so \boxed{3} or \boxed{4}", "4", math_answer.score) == [
      ("3", False), ("4", True)]
  assert reflection.answer_trajectory("no answer here", "4", math_answer.score) == []


def test_batch_metrics_hand_counted():
  texts = ["Answer: 5\nwait\nAnswer: 4",       # reflects, wrong -> right, final correct
           "Answer: 4\nlet me check\nAnswer: 5",  # reflects, right -> wrong, final wrong
           "Answer: 4",                        # no reflection, correct
           "Answer: 7\nAnswer: 8"]             # changes, wrong -> wrong, no phrase
  truths = ["4"] * 4
  correct = [math_answer.score(t, "4")[1] for t in texts]
  assert correct == [True, False, True, False]
  m = reflection.batch_metrics(texts, truths, correct, phrases=PHRASES,
                               reward_fn=math_answer.score)
  assert m == {"reflect_frac": 0.5, "reflect_frac_correct": 0.5, "reflect_frac_wrong": 0.5,
               "answer_change_frac": 0.75, "answer_right_to_wrong_frac": 0.25,
               "answer_wrong_to_right_frac": 0.25}
  all_right = reflection.batch_metrics(["Answer: 4"], ["4"], [True], phrases=PHRASES,
                                       reward_fn=math_answer.score)
  assert all_right["reflect_frac_correct"] == 0.0 and math.isnan(all_right["reflect_frac_wrong"])
  with pytest.raises(ValueError, match="lengths differ"):
    reflection.batch_metrics(["a"], [], [True], phrases=PHRASES, reward_fn=math_answer.score)


def test_groups_metrics_decodes_each_response_once():
  texts = {1: "Answer: 3", 2: "wait\nAnswer: 3", 3: "Answer: 2\nAnswer: 3"}
  tokens = np.array([[[1, 0], [2, 0]], [[3, 0], [1, 0]]], np.int32)
  calls = []

  def decode(rows):
    calls.append(rows)
    return [texts[r[0]] for r in rows]

  g = Groups(prompts=[[9], [9]], answers=["3", "2"], tokens=tokens,
             behav_logp=np.zeros((2, 2, 2), np.float32), versions=np.zeros((2, 2, 2), np.int32),
             lengths=np.ones((2, 2), np.int32),
             truncated=np.zeros((2, 2), bool), correct=np.array([[1, 1], [0, 0]], bool),
             parsed=np.ones((2, 2), bool),
             score=np.zeros((2, 2), np.float32), reward=np.zeros((2, 2), np.float32))
  m = reflection.groups_metrics(g, decode=decode, phrases=PHRASES, reward_fn=math_answer.score)
  assert calls == [[[1], [2], [3], [1]]]
  assert m["reflect_frac"] == 0.25 and m["reflect_frac_correct"] == 0.5
  # Response 3 vs truth "2": 2 (right) -> 3 (wrong).
  assert m["answer_right_to_wrong_frac"] == 0.25 and m["answer_change_frac"] == 0.25


def test_step_metrics_off_when_no_phrases():
  def decode(rows):
    raise AssertionError("decoded with the tracker off")

  assert reflection.step_metrics(None, spec="", decode=decode, reward_fn=math_answer.score) == {}
