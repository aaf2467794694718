"""Accuracy per difficulty level, every rollout step, where the task mixes levels.

The ablation testbed mixes problems of 2-5 operations (task.difficulty .. difficulty_max), and
dynamic sampling's subject — all-correct and all-wrong groups — sits at the ends of that mix.
Logged each step over every generated group (every round, discarded groups too, as
gen_accuracy), for each level L present:

  gen_accuracy_level{L}        share of level-L responses the verifier marked correct
  frac_groups_acc_1_level{L}   share of level-L groups that are all-correct (Fig. 3b, per level)
  frac_groups_acc_0_level{L}   share of level-L groups that are all-wrong
  gen_groups_level{L}          level-L groups generated

A prompt's level is read from its text (synthetic.level_of), so it holds after the hosts'
gather. Tasks without a level mix log none of these.
"""
from typing import Callable

import numpy as np

from dapo_jax.data import synthetic


class LevelTally:
  """Per-level correctness of the groups one rollout step generated."""

  def __init__(self, decode: Callable[[list], list] | None):
    self._decode = decode  # token-id lists -> texts; None: the task has no level mix
    self._rows: dict[int, list] = {}

  def wrap(self, generate: Callable):
    """generate(round_index, num_prompts) -> Groups, with each round's groups tallied."""
    if self._decode is None:
      return generate

    def tallied(round_index: int, num_prompts: int):
      groups = generate(round_index, num_prompts)
      self.observe(groups.prompts, groups.correct)
      return groups
    return tallied

  def observe(self, prompts: list, correct_NxG) -> None:
    correct_NxG = np.asarray(correct_NxG, bool)
    for text, row_G in zip(self._decode([list(p) for p in prompts]), correct_NxG):
      level = synthetic.level_of(text)
      if level is not None:
        self._rows.setdefault(level, []).append(row_G)

  def metrics(self) -> dict:
    out = {}
    for level, rows in sorted(self._rows.items()):
      c_nxG = np.stack(rows)
      out[f"gen_accuracy_level{level}"] = float(c_nxG.mean())
      out[f"frac_groups_acc_1_level{level}"] = float(c_nxG.all(axis=1).mean())
      out[f"frac_groups_acc_0_level{level}"] = float((~c_nxG).all(axis=1).mean())
      out[f"gen_groups_level{level}"] = len(rows)
    return out


def for_run(cfg, decode: Callable[[list], list]) -> LevelTally:
  """A step's tally: it counts for the synthetic task with a level mix (task.difficulty_max
  > 0); for any other task it passes rounds through and logs nothing."""
  mixed = cfg.task.name == "synthetic" and cfg.task.difficulty_max > 0
  return LevelTally(decode if mixed else None)
