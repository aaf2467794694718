"""Property and adversarial tests of the verifier: no exception, bounded time, known verdicts.

The parser (math_answer.judge) is called directly, so an exception fails the test instead of being
read as −1. Hypothesis runs derandomized (a fixed seed): CI sees the same cases every run. The full
100,000-case fuzz is experiments/fuzz_verifier.py; a 300-case run of it is checked here.
"""
import os
import sys
import time

from hypothesis import given, settings, strategies as st
import pytest

from dapo_jax import rewards
from dapo_jax.rewards import math_answer

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import fuzz_verifier  # noqa: E402  pylint: disable=wrong-import-position



def fixed(max_examples: int):
  """Hypothesis settings with a fixed seed and no example database: the same cases every run."""
  return settings(derandomize=True, database=None, deadline=None, max_examples=max_examples)

DIGIT_ZEROS = fuzz_verifier.DIGIT_ZEROS
truths = st.one_of(st.integers(-10**6, 10**6).map(str),
                   st.text(min_size=1, max_size=20).filter(str.strip))


@fixed(150)
@given(st.text(max_size=300), truths)
def test_judge_never_raises_on_any_text(text, gt):
  correct, pred = math_answer.judge(text, gt.strip())
  assert isinstance(correct, bool) and (pred is None or isinstance(pred, str))


@fixed(200)
@given(st.integers(-10**30, 10**30),
       st.lists(st.sampled_from(fuzz_verifier.DECORATIONS), min_size=1, max_size=3, unique=True),
       st.sampled_from(["Answer: ", "answer:", "**Answer:** ", "Answer:\n\n"]))
def test_decorated_integers_round_trip(n, decorations, marker):
  s = str(n)
  for d in decorations:
    s = d.format(s)
  assert math_answer.judge("Reasoning...\n" + marker + s, str(n))[0], s
  assert not math_answer.judge("Reasoning...\n" + marker + s, str(n + 1))[0], s


@fixed(200)
@given(st.integers(0, 10**6), st.integers(1, 10**3), st.sampled_from(fuzz_verifier.HEDGES),
       st.booleans())
def test_two_candidates_never_score(n, gap, hedge, truth_first):
  a, b = (n, n + gap) if truth_first else (n + gap, n)
  assert not math_answer.judge("Answer: " + hedge.format(a=a, b=b), str(n))[0]


@fixed(100)
@given(st.integers(0, 10**12), st.sampled_from(DIGIT_ZEROS))
def test_unicode_digits_read_as_ascii(n, zero):
  assert math_answer.judge("Answer: " + "".join(chr(zero + int(d)) for d in str(n)), str(n))[0]


@fixed(100)
@given(st.integers(0, 10**6), st.data())
def test_a_nul_byte_anywhere_is_wrong(n, data):
  text = f"Reasoning.\nAnswer: {n}"
  i = data.draw(st.integers(0, len(text)))
  assert not math_answer.judge(text[:i] + "\x00" + text[i:], str(n))[0]


@pytest.mark.parametrize("text", [
    "\\boxed{" * 100_000, "Answer: " + "\\boxed{" * 1_000 + "42" + "}" * 1_000,
    "{" * 100_000 + "}" * 99_999, "Answer: " + "1," * 50_000, "Answer: " + " " * 100_000 + "x",
    "answer " * 20_000, "Answer:" * 20_000, "Answer: " + "9" * 100_000, "\x00" * 100_000,
    "Answer: " + "٤" * 9_000, "Answer: 42" + " square" * 1_400, "(" * 5_000 + "42" + ")" * 5_000,
])
def test_adversarial_inputs_are_fast(text):
  t0 = time.thread_time()
  for gt in ("42", "\\frac{1}{2}"):
    math_answer.judge(text, gt)
  # 50 ms of CPU for two calls: linear work takes ~1 ms; a quadratic path would take seconds.
  assert time.thread_time() - t0 < 0.05


def test_fuzz_script_small_run():
  before = rewards.verifier_errors()
  report = fuzz_verifier.run(count=300, seed=0)
  assert (report["exceptions"], report["mismatches"]) == (0, 0), report["examples"]
  assert rewards.verifier_errors() == before
  assert report["cpu_max_ms"] < fuzz_verifier.MAX_TARGET_MS
