"""Tests for dapo_jax.data.arith_nl: answers follow the story, splits, determinism, wiring."""
import re

import pytest

from configs.base import base_config
from dapo_jax import config as config_lib
from dapo_jax.data import template
from dapo_jax.data.arith_nl import ArithNLTask
from dapo_jax.rewards import math_answer
from dapo_jax.train import setup

_NUM = re.compile(r"(?:has|buys|finds|gets|gives away|loses|sells) (\d+)")


def _story_value(problem: str) -> int:
  """Re-reads the story independently of the generator: start, then +gains / -losses."""
  total = None
  for sentence in problem.split(". "):
    m = _NUM.search(sentence)
    if m is None:
      continue
    x = int(m.group(1))
    if total is None:
      total = x
    elif re.search(r"gives away|loses|sells", sentence):
      total -= x
    else:
      total += x
    assert total >= 0, problem
  return total


@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_answers_solutions_and_prompts(difficulty):
  exs = ArithNLTask(difficulty, max_value=20).examples("train", 50)
  assert len({e.problem for e in exs}) == 50
  for e in exs:
    assert int(e.answer) == _story_value(e.problem), e.problem
    assert e.problem.count(".") == difficulty + 1 and e.problem.endswith("have now?")
    assert template.split_prompt(e.prompt) == e.problem
    assert len(e.solution.splitlines()) == difficulty + 1
    assert math_answer.score(e.solution, e.answer)[1]


def test_splits_disjoint_and_deterministic():
  task = ArithNLTask(2, seed=3)
  train, held = task.examples("train", 200), task.examples("heldout", 40)
  assert not {e.problem for e in train} & {e.problem for e in held}
  assert [e.problem for e in held] == [e.problem for e in ArithNLTask(2, seed=3).examples(
      "heldout", 40)]
  assert [e.problem for e in held] != [e.problem for e in ArithNLTask(2, seed=4).examples(
      "heldout", 40)]


@pytest.mark.parametrize("shots", [1, 2])
def test_worked_examples_in_the_prompt(shots):
  task, plain = ArithNLTask(2, seed=1, shots=shots), ArithNLTask(2, seed=1)
  shown = plain.examples("train", shots)
  assert [x.problem for x in task.worked_examples()] == [x.problem for x in shown]
  train, held = task.examples("train", 30), task.examples("heldout", 10)
  assert not {x.problem for x in shown} & {x.problem for x in train + held}  # never asked
  for e in train + held:
    inner = template.split_prompt(e.prompt)
    assert inner.endswith("Now solve this problem.\n" + e.problem), inner
    for x in shown:  # each example with its reference solution, which the reward accepts
      assert f"Problem: {x.problem}\nSolution:\n{x.solution}\n" in inner
      assert x.solution.endswith(f"Answer: {x.answer}")
  assert [e.problem for e in held] == [e.problem for e in plain.examples("heldout", 10)]
  assert ArithNLTask(2, seed=1).preamble() == ""


def test_shots_config():
  c = base_config()
  c.task.name, c.task.eval_name, c.task.num_train, c.task.shots = (
      "arith_nl", "arith_nl_heldout", 8, 1)
  c.eval.num_problems = 4
  task = setup.load_task(config_lib.parse(c))
  assert all("Worked example.\nProblem: " in e.prompt for e in task.train + task.eval)
  c.task.name, c.task.eval_name = "synthetic", "synthetic_heldout"
  with pytest.raises(ValueError, match="task.shots: only the arith_nl task"):
    config_lib.parse(c)
  c.task.name, c.task.shots = "arith_nl", -1
  with pytest.raises(ValueError, match="task.shots"):
    config_lib.parse(c)


def test_bad_arguments():
  for kwargs, message in [({"difficulty": 0}, "arith_nl.difficulty"),
                          ({"difficulty": 1, "shots": 9}, "arith_nl.shots"),
                          ({"difficulty": 1, "max_value": 1}, "arith_nl.max_value"),
                          ({"difficulty": 1, "seed": 1.5}, "arith_nl.seed")]:
    with pytest.raises(ValueError, match=message):
      ArithNLTask(**kwargs)
  with pytest.raises(ValueError, match="split:"):
    ArithNLTask(1).examples("test", 1)
  with pytest.raises(ValueError, match="too small"):
    ArithNLTask(1, max_value=2).examples("heldout", 500)


def test_load_task_wiring():
  c = base_config()
  c.task.name, c.task.eval_name, c.task.num_train = "arith_nl", "arith_nl_heldout", 64
  c.eval.num_problems = 8
  task = setup.load_task(config_lib.parse(c))
  assert len(task.train) == 64 and len(task.eval) == 8
  assert task.eval[0].source == "arith_nl" and task.eos_ids == (task.tokenizer.eos_token_id,)
  c.task.eval_name = "synthetic_heldout"
  with pytest.raises(ValueError, match="synthetic_heldout needs task.name='synthetic'"):
    setup.load_task(config_lib.parse(c))


@pytest.mark.parametrize("arg", [None, "runlocal=True", "difficulty=2"])
def test_smollm2_config_parses(arg):
  import importlib
  c = config_lib.parse(importlib.import_module("configs.smollm2_cpu").get_config(arg))
  assert (c.task.name, c.task.eval_name, c.task.chat_template) == (
      "arith_nl", "arith_nl_heldout", True)
  assert c.model.hf_path == c.task.tokenizer  # the imported checkpoint's own tokenizer
