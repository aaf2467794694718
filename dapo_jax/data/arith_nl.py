"""Natural-language arithmetic word problems: a verifiable task for a small real (chat) model.

The synthetic task's "Compute 3+8-5." suits a model trained here on that format; a pretrained
instruct model reads text. Each problem is a short story with `difficulty` changes to a count:

  difficulty 2:  "Mia has 7 apples. She buys 5 more apples. Then she gives away 3 apples.
                  How many apples does Mia have now?"   -> 9

wrapped in the DAPO prompt template (its last line must be "Answer: N"), scored by
rewards.math_answer. Numbers stay in 1..max_value and the count never goes below zero. Train and
held-out problems never coincide: a problem's split is a hash of its text, whatever the seed.
"""
import dataclasses
import random

from dapo_jax.data import template
from dapo_jax.data.example import Example, check_examples_args, check_int_fields, split_of

MAX_DIFFICULTY = 6
MAX_SHOTS = 8
_NAMES = (("Mia", "She"), ("Sam", "He"), ("Ava", "She"), ("Leo", "He"), ("Zoe", "She"),
          ("Ben", "He"), ("Ivy", "She"), ("Max", "He"), ("Eva", "She"), ("Tom", "He"))
_ITEMS = ("apples", "books", "coins", "pencils", "marbles", "stickers", "cookies", "stamps")
_GAINS = ("buys {x} more {item}", "finds {x} more {item}", "gets {x} more {item} as a gift")
_LOSSES = ("gives away {x} {item}", "loses {x} {item}", "sells {x} {item}")


@dataclasses.dataclass(frozen=True)
class ArithNLTask:
  """Seeded generator of word problems. difficulty = changes to the count (steps to solve)."""
  difficulty: int
  seed: int = 0
  max_value: int = 20  # largest number in a problem (and its start count)
  heldout_percent: int = 10  # share of the problem space that belongs to the held-out split
  shots: int = 0  # worked examples (train problems with their solutions) before each problem

  def __post_init__(self):
    check_int_fields(self, (("difficulty", 1, MAX_DIFFICULTY), ("max_value", 2, 10**6),
                            ("heldout_percent", 1, 99), ("shots", 0, MAX_SHOTS)),
                     prefix="arith_nl.")

  def worked_examples(self) -> list[Example]:
    """The `shots` problems shown before each problem: the first ones a shot-free task of this
    seed and difficulty draws for "train" (never held-out, and left out of this task's lists)."""
    if not self.shots:
      return []
    return dataclasses.replace(self, shots=0).examples("train", self.shots)

  def preamble(self) -> str:
    """The worked examples inside the DAPO template before the problem ("" for 0 shots), each
    with its reference solution ending in "Answer: N" (the format the reward reads)."""
    shown = "".join(f"Problem: {x.problem}\nSolution:\n{x.solution}\n\n"
                    for x in self.worked_examples())
    if not shown:
      return ""
    return f"Worked example{'s' if self.shots > 1 else ''}.\n{shown}Now solve this problem.\n"

  def split_of(self, problem: str) -> str:
    return split_of(problem, self.heldout_percent)

  def examples(self, split: str, n: int) -> list[Example]:
    """n distinct problems of `split`, the same list for the same (seed, split, n)."""
    check_examples_args(split, n)
    rng = random.Random(f"arith_nl/{self.seed}/{split}/{self.difficulty}/{self.max_value}")
    preamble = self.preamble()
    out, seen = [], {x.problem for x in self.worked_examples()}
    for _ in range(1000 + 200 * n):
      if len(out) == n:
        return out
      problem, answer, solution = self._draw(rng)
      if problem in seen or self.split_of(problem) != split:
        continue
      seen.add(problem)
      out.append(Example(
          id=f"arith_nl-d{self.difficulty}-{split}-{len(out):06d}", problem=problem,
          prompt=template.make_prompt(preamble + problem), answer=str(answer), solution=solution,
          source="arith_nl"))
    raise ValueError(f"n: found only {len(out)} distinct {split} problems of {n} requested; "
                     f"the problem space at difficulty={self.difficulty}, "
                     f"max_value={self.max_value} is too small")

  def _draw(self, rng: random.Random) -> tuple[str, int, str]:
    """(problem text, answer, reference solution ending in 'Answer: N')."""
    name, pronoun = rng.choice(_NAMES)
    item = rng.choice(_ITEMS)
    total = rng.randint(2, self.max_value)  # "has 1 apples" reads wrong
    sentences, lines = [f"{name} has {total} {item}."], []
    for step in range(self.difficulty):
      gain = total == 0 or rng.random() < 0.5
      x = rng.randint(1, self.max_value if gain else min(total, self.max_value))
      phrase = rng.choice(_GAINS if gain else _LOSSES).format(x=x, item=item)
      sentences.append(f"{'Then ' + pronoun.lower() if step else pronoun} {phrase}.")
      new = total + x if gain else total - x
      lines.append(f"{total} {'+' if gain else '-'} {x} = {new}")
      total = new
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences), total, "\n".join(lines + [f"Answer: {total}"])
