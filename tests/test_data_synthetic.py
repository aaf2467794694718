"""Tests for dapo_jax.data.synthetic: determinism, disjoint splits, reward path, difficulty knob."""
import random
import re

import pytest

from dapo_jax.data import synthetic, template
from dapo_jax.data import tokenizer as tok_lib
from dapo_jax.data.synthetic import SyntheticTask
from dapo_jax.rewards import math_answer


def test_deterministic_and_seeded():
  a = SyntheticTask(4, seed=1).examples("train", 50)
  assert a == SyntheticTask(4, seed=1).examples("train", 50)
  assert a[:20] == SyntheticTask(4, seed=1).examples("train", 20)  # prefix-stable in n
  assert [e.problem for e in a] != [e.problem for e in SyntheticTask(4, seed=2).examples(
      "train", 50)]
  assert len({e.id for e in a}) == len({e.problem for e in a}) == 50


@pytest.mark.parametrize("difficulty,digits", [(3, 1), (4, 1), (2, 2)])
def test_splits_never_share_a_problem(difficulty, digits):
  problems = {}
  for split in synthetic.SPLITS:
    for seed in (0, 1):
      n = 1000 if split == "train" else 100
      exs = SyntheticTask(difficulty, seed=seed, digits=digits).examples(split, n)
      problems.setdefault(split, set()).update(e.problem for e in exs)
  assert not problems["train"] & problems["heldout"]
  task = SyntheticTask(difficulty, digits=digits)
  assert all(task.split_of(p) == "heldout" for p in problems["heldout"])


def test_examples_are_correct_and_scored_by_the_real_reward():
  for difficulty in (1, 4, 7):
    for e in SyntheticTask(difficulty, seed=5, digits=2).examples("heldout", 30):
      expr = re.fullmatch(r"Compute ([0-9+-]+)\.", e.problem).group(1)
      assert int(e.answer) == eval(expr)  # pylint: disable=eval-used
      assert e.prompt == template.PREFIX + e.problem + template.SUFFIX
      lines = e.solution.split("\n")
      assert len(lines) == difficulty + 1 and lines[-1] == f"Answer: {e.answer}"
      # Every line is right, and running totals never go negative.
      for line in lines[:-1]:
        lhs, rhs = line.split("=")
        assert eval(lhs) == int(rhs) >= 0  # pylint: disable=eval-used
      assert math_answer.score(e.solution, e.answer) == (1.0, True, e.answer)
      assert synthetic.score(e.solution, e) == math_answer.score(e.solution, e.answer)
      wrong = e.solution.rsplit("\n", 1)[0] + f"\nAnswer: {int(e.answer) + 1}"
      assert synthetic.score(wrong, e)[:2] == (-1.0, False)
      assert synthetic.parse_problem(e.problem)[0][0] == int(expr.split("+")[0].split("-")[0])


def test_difficulty_changes_length_and_baseline_accuracy():
  tok = tok_lib.load_tokenizer()
  rows = [synthetic.baseline_row(SyntheticTask(d, seed=0), n_train=300, n_heldout=200,
                                 tokenizer=tok) for d in (3, 4, 6, 8)]
  lengths = [r["resp_tokens_mean"] for r in rows]
  noisy = [r["noisy"] for r in rows]
  assert lengths == sorted(lengths) and lengths[-1] > 2 * lengths[0]
  assert noisy == sorted(noisy, reverse=True) and noisy[0] - noisy[-1] > 0.15
  assert all(r["majority"] < 0.15 and r["all_plus"] < 0.25 for r in rows)
  # The default demo setting keeps responses short for a tiny CPU model.
  assert rows[1]["resp_tokens_max"] <= 48 and rows[1]["prompt_tokens_max"] <= 80


def test_noisy_solution_error_rate_extremes():
  e = SyntheticTask(5, seed=0).examples("train", 1)[0]
  rng = random.Random(0)
  assert synthetic.noisy_solution(e, error_rate=0.0, rng=rng) == e.solution
  assert not synthetic.score(synthetic.noisy_solution(e, error_rate=1.0, rng=rng), e)[1]


def test_bad_arguments():
  for kwargs, name in [({"difficulty": 0}, "difficulty"), ({"difficulty": 2.0}, "difficulty"),
                       ({"difficulty": 3, "digits": 0}, "digits"),
                       ({"difficulty": 3, "heldout_percent": 100}, "heldout_percent"),
                       ({"difficulty": 3, "seed": "0"}, "seed")]:
    with pytest.raises(ValueError, match=f"^{name}:"):
      SyntheticTask(**kwargs)
  task = SyntheticTask(3)
  with pytest.raises(ValueError, match="split: expected one of"):
    task.examples("test", 3)
  with pytest.raises(ValueError, match="n: expected an int >= 0"):
    task.examples("train", -1)
  with pytest.raises(ValueError, match=r"n: found only \d+ distinct heldout problems of 500"):
    SyntheticTask(1).examples("heldout", 500)  # only ~10 % of ~120 one-step problems
  for bad in ("3+4", "Compute 3+.", "Compute 3*4."):
    with pytest.raises(ValueError, match="problem:"):
      synthetic.parse_problem(bad)


def test_table_cli(capsys):
  synthetic.main(["--difficulties", "1,3", "--digits", "1", "--n_train", "200",
                  "--n_heldout", "100"])
  out = capsys.readouterr().out
  assert "| 1 | 1 | n: found only" in out  # too small a space is reported, not hidden
  assert re.search(r"^\| 3 \| 1 \| 0\.\d+ \| 0\.\d+ \| 0\.\d+ \| \d+\.\d / \d+ \| \d+ \|$", out,
                   flags=re.M)
