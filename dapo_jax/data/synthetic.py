"""A synthetic verifiable task for CPU runs: multi-operand +/- arithmetic, solved line by line.

Same shape as DAPO-Math: an integer answer, the DAPO prompt template, a reference response whose
last line is "Answer: N", scored by rewards.math_answer.score. The difficulty knob is the number of
operations, i.e. the number of reasoning lines, so it changes both accuracy and response length:

  problem  "Compute 3+8-5+9."
  solution "3+8=11\\n11-5=6\\n6+9=15\\nAnswer: 15"

`digits` bounds the operands (1..10**digits - 1). Running totals never go negative. Train and
held-out problems never coincide: a problem's split is a hash of its text, whatever the seed.
`difficulty_max` > 0 mixes difficulties: problems cycle through the operation counts
difficulty..difficulty_max, an equal share each (the testbed of data/testbed.py; 0 = every
problem at `difficulty`).

  python -m dapo_jax.data.synthetic   # prints the difficulty table (baselines, lengths)
"""
import argparse
import collections
import dataclasses
import random
import re

from dapo_jax.data import template
from dapo_jax.data.example import SPLITS  # noqa: F401  (re-exported)
from dapo_jax.data.example import Example, check_examples_args, check_int_fields, split_of

MAX_DIFFICULTY = 16


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
  """Seeded generator of problems. difficulty = operations (lines of reasoning); with
  difficulty_max > 0, equal shares of problems at each count in [difficulty, difficulty_max]."""
  difficulty: int
  seed: int = 0
  digits: int = 1
  heldout_percent: int = 10  # share of the problem space that belongs to the held-out split
  difficulty_max: int = 0    # 0 = every problem has `difficulty` operations

  def __post_init__(self):
    check_int_fields(self, (("difficulty", 1, MAX_DIFFICULTY), ("digits", 1, 6),
                            ("heldout_percent", 1, 99), ("difficulty_max", 0, MAX_DIFFICULTY)))
    if self.difficulty_max and self.difficulty_max < self.difficulty:
      raise ValueError(f"difficulty_max: {self.difficulty_max} is below difficulty "
                       f"{self.difficulty} (0 = no mix)")

  def split_of(self, problem: str) -> str:
    """'heldout' or 'train', from a hash of the problem text alone (independent of the seed)."""
    return split_of(problem, self.heldout_percent)

  def examples(self, split: str, n: int) -> list[Example]:
    """n distinct problems of `split`, the same list for the same (seed, split, n). With a mix,
    problem i has difficulty + i mod (difficulty_max - difficulty + 1) operations: equal shares
    per level, whatever the size of each level's problem space."""
    check_examples_args(split, n)
    mix = f"-{self.difficulty_max}" if self.difficulty_max else ""  # old streams unchanged
    rng = random.Random(f"synthetic/{self.seed}/{split}/{self.difficulty}{mix}/{self.digits}")
    out, seen, attempts = [], set(), 0
    max_attempts = 1000 + 200 * n
    levels = self.difficulty_max - self.difficulty + 1 if self.difficulty_max else 1
    while len(out) < n:
      attempts += 1
      if attempts > max_attempts:
        raise ValueError(
            f"n: found only {len(out)} distinct {split} problems of {n} requested in "
            f"{max_attempts} draws; the problem space at difficulty={self.difficulty}{mix}, "
            f"digits={self.digits} is too small (raise difficulty or digits, or lower n)")
      operands, ops = self._draw(rng, self.difficulty + len(out) % levels)
      problem = problem_text(operands, ops)
      if problem in seen or self.split_of(problem) != split:
        continue
      seen.add(problem)
      out.append(Example(
          id=f"synthetic-d{self.difficulty}{mix}-{split}-{len(out):06d}", problem=problem,
          prompt=template.make_prompt(problem), answer=str(evaluate(operands, ops)),
          solution=solution_text(operands, ops), source="synthetic"))
    return out

  def _draw(self, rng: random.Random, n_ops: int):
    hi = 10**self.digits - 1
    operands, ops = [rng.randint(1, hi)], []
    total = operands[0]
    for _ in range(n_ops):
      op = "+" if total == 0 else rng.choice("+-")
      x = rng.randint(1, hi) if op == "+" else rng.randint(0, min(total, hi))
      total = total + x if op == "+" else total - x
      operands.append(x)
      ops.append(op)
    return operands, ops


def problem_text(operands, ops) -> str:
  expr = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:]))
  return f"Compute {expr}."


def evaluate(operands, ops) -> int:
  total = operands[0]
  for op, x in zip(ops, operands[1:]):
    total = total + x if op == "+" else total - x
  return total


def solution_text(operands, ops) -> str:
  """The reference response: one line per operation, then the "Answer:" line the reward reads."""
  lines, total = [], operands[0]
  for op, x in zip(ops, operands[1:]):
    new = total + x if op == "+" else total - x
    lines.append(f"{total}{op}{x}={new}")
    total = new
  return "\n".join(lines + [f"Answer: {total}"])


def score(text: str, example: Example):
  """The real data's reward: rewards.math_answer.score(text, answer) -> (reward, correct, pred)."""
  from dapo_jax.rewards import math_answer  # pylint: disable=g-import-not-at-top
  return math_answer.score(text, example.answer)


def noisy_solution(example: Example, *, error_rate: float, rng: random.Random) -> str:
  """The reference solution with each line's result off by one with probability error_rate.

  A stand-in for an imperfect step-by-step solver: an error propagates to the answer, so its
  accuracy falls as (1 - error_rate) ** difficulty.
  """
  operands, ops = parse_problem(example.problem)
  lines, total = [], operands[0]
  for op, x in zip(ops, operands[1:]):
    new = total + x if op == "+" else total - x
    if rng.random() < error_rate:
      new += 1
    lines.append(f"{total}{op}{x}={new}")
    total = new
  return "\n".join(lines + [f"Answer: {total}"])


_PROBLEM_RE = re.compile(r"Compute \d+(?:[+-]\d+)*\.")


def level_of(prompt_text: str) -> int | None:
  """The number of operations of the synthetic problem inside a prompt (templated or not), or
  None when the text holds none: the difficulty level of a mixed task's prompt."""
  found = _PROBLEM_RE.findall(prompt_text)
  return len(parse_problem(found[-1])[1]) if found else None


def parse_problem(problem: str):
  """Inverse of problem_text: 'Compute 3+8-5.' -> ([3, 8, 5], ['+', '-'])."""
  if not (problem.startswith("Compute ") and problem.endswith(".")):
    raise ValueError(f"problem: not a synthetic problem: {problem!r}")
  expr = problem[len("Compute "):-1]
  operands, ops, num = [], [], ""
  for ch in expr:
    if ch.isdigit():
      num += ch
    elif ch in "+-" and num:
      operands.append(int(num))
      ops.append(ch)
      num = ""
    else:
      raise ValueError(f"problem: unexpected {ch!r} in {problem!r}")
  if not num:
    raise ValueError(f"problem: expression ends without an operand: {problem!r}")
  operands.append(int(num))
  return operands, ops


def baseline_row(task: SyntheticTask, *, n_train: int, n_heldout: int, tokenizer=None,
                 error_rate: float = 0.1) -> dict:
  """Held-out accuracy of trivial baselines and reference-response length for one task setting.

  Baselines, each scored through rewards.math_answer.score: "majority" always answers the most
  common train answer; "all_plus" adds every operand, ignoring the minus signs (a shortcut that
  is right only when nothing is subtracted); "noisy" is the reference solver with a per-line error
  (see noisy_solution).
  """
  train = task.examples("train", n_train)
  heldout = task.examples("heldout", n_heldout)
  majority = collections.Counter(e.answer for e in train).most_common(1)[0][0]
  rng = random.Random(f"noisy/{task.seed}")
  acc = collections.Counter()
  for e in heldout:
    acc["majority"] += score(f"Answer: {majority}", e)[1]
    acc["all_plus"] += score(f"Answer: {sum(parse_problem(e.problem)[0])}", e)[1]
    acc["noisy"] += score(noisy_solution(e, error_rate=error_rate, rng=rng), e)[1]
  row = {"difficulty": task.difficulty, "digits": task.digits,
         **{k: acc[k] / len(heldout) for k in ("majority", "all_plus", "noisy")},
         "chars_mean": sum(len(e.solution) for e in heldout) / len(heldout)}
  if tokenizer is not None:
    resp = [len(tokenizer.encode(e.solution, add_special_tokens=False)) + 1 for e in heldout]
    prompt = [len(tokenizer.encode(e.prompt)) for e in heldout]
    row.update(resp_tokens_mean=sum(resp) / len(resp), resp_tokens_max=max(resp),
               prompt_tokens_max=max(prompt))
  return row


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--difficulties", default="2,3,4,5,6,8")
  parser.add_argument("--digits", default="1,2")
  parser.add_argument("--n_train", type=int, default=1000)
  parser.add_argument("--n_heldout", type=int, default=300)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args(argv)
  from dapo_jax.data import tokenizer as tok_lib  # pylint: disable=g-import-not-at-top
  tok = tok_lib.load_tokenizer()
  print("| difficulty | digits | majority acc | all-plus acc | noisy solver acc (10%/line) "
        "| response tokens mean / max (incl. eos) | prompt tokens max (incl. bos) |")
  print("|---|---|---|---|---|---|---|")
  for digits in (int(d) for d in args.digits.split(",")):
    for d in (int(x) for x in args.difficulties.split(",")):
      try:
        r = baseline_row(SyntheticTask(d, args.seed, digits=digits), n_train=args.n_train,
                         n_heldout=args.n_heldout, tokenizer=tok)
      except ValueError as e:  # a problem space smaller than n: say so in the table
        print(f"| {d} | {digits} | {e} |")
        continue
      print(f"| {d} | {digits} | {r['majority']:.3f} | {r['all_plus']:.3f} | "
            f"{r['noisy']:.3f} | {r['resp_tokens_mean']:.1f} / {r['resp_tokens_max']} | "
            f"{r['prompt_tokens_max']} |")


if __name__ == "__main__":
  main()
