"""The ablation testbed: the synthetic task with mixed difficulty, and a base policy warm-started
on imperfect demonstrations, so that each DAPO technique has something to act on.

The problems are the synthetic task's (`task.difficulty` .. `task.difficulty_max` operations,
scored by rewards.math_answer). What differs is the base policy: `warm_start` fits it to
*demonstrations* written by `demo_response` instead of the exact reference solutions. A
demonstration, for "Compute 3+8-5.":

  3 + 8=12            a slip: the line's result off by 1 or 2 (error_rate)
  check: 3+8 = 11     a re-check line recomputing the line, correcting a slip (recheck_rate)
  11 - 5 = 6          spaces around '+', '-', '=' each present with probability `spacing`
  Answer: 6

or a degenerate one that repeats a line until the generation limit cuts it (loop_rate).

Which knob exercises which technique (configs/testbed_cpu.py sets them; the measured base
figures are in dapo_jax/assets/README.md):

  task.difficulty_max     mixed difficulty: hard problems give all-wrong groups, easy ones can
                          reach all-correct groups as RL improves them: dynamic sampling has
                          groups to filter (Fig. 3b; at the shipped base only all-wrong ones).
  warm_start.loop_rate    repetition loops: truncated, answerless responses: the overlong filter
                          and the soft punishment act on them (Table 1 rows 2 and 4, Fig. 5).
  warm_start.recheck_rate re-check lines: longer responses that are more often right, so length
                          carries signal; with difficulty this makes lengths long-tailed, and
                          the sample- vs token-level weighting of those tokens differs (Fig. 4).
  warm_start.spacing      free choices at every operator: sampling entropy that RL can collapse
                          or keep, Clip-Higher's subject (Fig. 2).
  warm_start.error_rate   slips on result digits: entropy where it decides the reward.

All knobs at 0 give back the exact reference solution (Example.solution).
"""
import random

from dapo_jax.data import synthetic
from dapo_jax.data.example import Example

RECHECK = "check: "  # the re-check line's marker (log.reflection_phrases="check" tracks it)
DEMO_KNOBS = ("error_rate", "recheck_rate", "loop_rate", "spacing")
LOOP_REPEATS = 24  # repeats of a looping line: past any generation limit of the testbed


def _line(a: int, op: str, x: int, result: int, spacing: float, rng: random.Random) -> str:
  gap = lambda: " " if spacing and rng.random() < spacing else ""  # noqa: E731
  return f"{a}{gap()}{op}{gap()}{x}{gap()}={gap()}{result}"


def demo_response(example: Example, *, error_rate: float, recheck_rate: float,
                  loop_rate: float, spacing: float, rng: random.Random) -> str:
  """One demonstration for `example` (a synthetic problem); see the module docstring."""
  operands, ops = synthetic.parse_problem(example.problem)
  lines, total = [], operands[0]
  for op, x in zip(ops, operands[1:]):
    right = total + x if op == "+" else total - x
    wrote = right
    if error_rate and rng.random() < error_rate:
      wrote = right + rng.choice((-2, -1, 1, 2))
      wrote = wrote if wrote >= 0 else right + 1
    line = _line(total, op, x, wrote, spacing, rng)
    lines.append(line)
    if loop_rate and rng.random() < loop_rate:
      return "\n".join(lines + [line] * LOOP_REPEATS)
    if recheck_rate and rng.random() < recheck_rate:
      lines.append(RECHECK + _line(total, op, x, right, spacing, rng))
      wrote = right
    total = wrote
  return "\n".join(lines + [f"Answer: {total}"])


def demo_fn(knobs: dict):
  """example, rng -> demonstration text, or None when every knob is 0 (exact references)."""
  unknown = sorted(set(knobs) - set(DEMO_KNOBS))
  if unknown:
    raise ValueError(f"testbed: unknown demonstration knob(s) {unknown}; known: {DEMO_KNOBS}")
  for k, v in knobs.items():
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
      raise ValueError(f"config.warm_start.{k}: expected a probability in [0, 1], got {v!r}")
  if not any(knobs.values()):
    return None
  return lambda example, rng: demo_response(example, rng=rng, **knobs)
