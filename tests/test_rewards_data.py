"""The verifier on every real ground truth: the vendored eval sets and DAPO-Math-17k.

Each answer string `a` as the data stores it must score +1 written as "Answer: a" (and, when it is
an integer, in a decorated form), and −1 for another integer or a two-candidate hedge.
"""
import json

import pytest

from dapo_jax.data import readers
from dapo_jax.rewards import answer_forms, math_answer

VENDORED = ("aime24_qwen25math.jsonl", "aime25_areal.jsonl", "amc23_qwen25math.jsonl",
            "math500_simplerl.jsonl")


def _as_integer(answer: str) -> str | None:
  """The canonical integer an answer string states ('x = 016' -> '16'), else None."""
  n = answer_forms.as_number(answer)
  return n if n is not None and "." not in n else None


def _failures(answers) -> list:
  """(answer, response, verdict) triples where the verifier disagrees with the expectation."""
  bad = []
  for a in answers:
    n = _as_integer(a)
    other = str(int(n) + 1) if n is not None else "7"
    want = [(f"Reasoning...\nAnswer: {a}", True), (f"Reasoning...\nAnswer: {other}", False)]
    if n is not None:
      want += [(f"Answer: $\\boxed{{{n}}}$.", True), (f"Answer: x = {other} or x = {n}", False),
               (f"Answer:\n{n}", True)]
    bad += [(a, text, not ok) for text, ok in want if math_answer.judge(text, a)[0] != ok]
  return bad


@pytest.mark.parametrize("filename", VENDORED)
def test_vendored_raw_answers(filename):
  path = readers.ASSETS_DIR / filename
  answers = [str(json.loads(line)["answer"]) for line in path.read_text().splitlines() if line]
  assert len(answers) >= 30
  assert _failures(answers) == []


@pytest.mark.parametrize("name", ["aime_2024", "aime_2025", "amc_2023", "math_500"])
def test_vendored_canonical_answers(name):
  examples, _ = readers.load_examples(name)
  assert _failures([e.answer for e in examples]) == []


def test_dapo_math_17k_answers():
  path = readers.default_path("dapo_math_17k")
  if not path.is_file():
    pytest.fail(f"shared data not found at {path}; set DAPO_SHARED_DATA to the data directory")
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  rows = pq.read_table(path, columns=["reward_model"]).column("reward_model").to_pylist()
  answers = sorted({r["ground_truth"] for r in rows})  # 2,251 distinct; judge is deterministic
  assert len(rows) == 17917 and all(_as_integer(a) is not None for a in answers)
  assert _failures(answers) == []
