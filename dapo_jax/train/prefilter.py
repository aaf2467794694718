"""Difficulty pre-filter (`algo.prefilter`): don't generate groups that a prompt's history
says will be uniform (all correct or all wrong), since dynamic sampling would discard them.

Each prompt (keyed by a hash of its token ids, the same on every host and after a resume) has a
record: `seen` (groups sampled), a decayed count of responses `weight` and of correct ones
`passed` (each new group: weight <- decay·weight + G, passed <- decay·passed + #correct), and
`last_step`. A prompt is skippable when seen >= min_seen and its decayed pass rate
passed / weight is <= margin or >= 1 − margin (margin 0: every recorded response right, or every
one wrong). A skippable prompt is still sampled with probability `revisit`, drawn from a hash of
(seed, step, key): deterministic for a seed, independent of the order prompts arrive in, and a
fresh draw each step, so records of a prompt the policy has moved on from get refreshed.

Used by the trainer on each generation round: `select` drops the round's skipped prompts before
sampling (the round shrinks; dynamic sampling runs more rounds to fill the batch, which is the
point: fewer generated tokens per kept group). If every prompt of a round is skippable the first
one is kept, so a round never samples nothing. `observe` updates the records from the round's
scored groups. Records go into the checkpoint (`state` / `restore`), so a resumed run skips the
same prompts. Needs dynamic sampling (a fixed batch cannot shrink) and one process (hosts would
skip different numbers of prompts and their gathers would not line up).
"""
import dataclasses
import hashlib

import numpy as np


@dataclasses.dataclass(frozen=True)
class Record:
  seen: int  # groups sampled
  weight: float  # decayed responses observed
  passed: float  # decayed correct responses
  last_step: int  # rollout step of the last observation

  @property
  def pass_rate(self) -> float:
    return self.passed / self.weight if self.weight > 0 else 0.5


def prompt_key(prompt_ids) -> str:
  """A stable key for a prompt: a hash of its token ids."""
  return hashlib.sha256(np.asarray(prompt_ids, np.int64).tobytes()).hexdigest()[:20]


def observe(records: dict, keys, correct_NxG, *, step: int, decay: float) -> dict:
  """A new records dict with one group per key folded in (the input is left unchanged)."""
  correct_NxG = np.asarray(correct_NxG, bool)
  if correct_NxG.ndim != 2 or len(keys) != correct_NxG.shape[0]:
    raise ValueError(f"correct_NxG: expected [{len(keys)}, G], got shape {correct_NxG.shape}")
  out = dict(records)
  G = correct_NxG.shape[1]
  for key, row in zip(keys, correct_NxG):
    old = out.get(key, Record(0, 0.0, 0.0, step))
    out[key] = Record(seen=old.seen + 1, weight=decay * old.weight + G,
                      passed=decay * old.passed + float(row.sum()), last_step=step)
  return out


def skippable(rec: Record | None, *, min_seen: int, margin: float) -> bool:
  if rec is None or rec.seen < min_seen:
    return False
  return rec.pass_rate <= margin or rec.pass_rate >= 1 - margin


def revisit_draw(seed: int, step: int, key: str) -> float:
  """A uniform [0, 1) number fixed by (seed, step, key)."""
  h = hashlib.sha256(f"prefilter/{seed}/{step}/{key}".encode()).digest()
  return int.from_bytes(h[:8], "big") / 2.0**64


class Prefilter:
  """The records plus this step's counters; see the module doc."""

  def __init__(self, *, seed: int, decay: float, min_seen: int, margin: float, revisit: float):
    self.seed, self.decay, self.min_seen = seed, decay, min_seen
    self.margin, self.revisit = margin, revisit
    self.records: dict[str, Record] = {}
    self._counts = {"prefilter_skipped": 0, "prefilter_revisited": 0}

  def keep_mask(self, keys, *, step: int) -> np.ndarray:
    """True for each key to sample this round (not skippable, or drawn for a re-visit)."""
    skip = np.array([skippable(self.records.get(k), min_seen=self.min_seen, margin=self.margin)
                     for k in keys], bool)
    drawn = np.array([s and revisit_draw(self.seed, step, k) < self.revisit
                      for k, s in zip(keys, skip)], bool)
    keep = ~skip | drawn
    if keys and not keep.any():
      keep[0] = True  # a round never samples nothing
    self._counts["prefilter_skipped"] += int((~keep).sum())
    self._counts["prefilter_revisited"] += int(drawn.sum())
    return keep

  def select(self, batch, *, step: int):
    """The PromptBatch without its skipped prompts."""
    idx = np.flatnonzero(self.keep_mask([prompt_key(p) for p in batch.prompt_ids], step=step))
    return dataclasses.replace(
        batch, examples=[batch.examples[i] for i in idx],
        prompt_ids=[batch.prompt_ids[i] for i in idx], lengths_B=batch.lengths_B[idx],
        truncated_B=batch.truncated_B[idx])

  def observe(self, groups, *, step: int) -> None:
    self.records = observe(self.records, [prompt_key(p) for p in groups.prompts],
                           groups.correct, step=step, decay=self.decay)

  def step_metrics(self) -> dict:
    """This step's counters (then reset) and the number of prompts with a record."""
    out = dict(self._counts, prefilter_records=len(self.records))
    self._counts = dict.fromkeys(self._counts, 0)
    return out

  def state(self) -> dict:
    """The records as JSON (floats round-trip exactly)."""
    return {k: [r.seen, r.weight, r.passed, r.last_step] for k, r in self.records.items()}

  def restore(self, state) -> None:
    if not isinstance(state, dict):
      raise ValueError("checkpoint: no pre-filter records (saved with algo.prefilter off?); "
                       f"got {type(state).__name__}")
    self.records = {k: Record(int(s), float(w), float(p), int(t))
                    for k, (s, w, p, t) in state.items()}


def from_config(algo, *, seed: int, num_processes: int) -> Prefilter | None:
  """The run's Prefilter when `algo.prefilter` is on, else None."""
  if not algo.prefilter:
    return None
  if num_processes > 1:
    raise ValueError(f"config.algo.prefilter: runs on one process only, got {num_processes} "
                     "(hosts would skip different numbers of prompts)")
  return Prefilter(seed=seed, decay=algo.prefilter_decay, min_seen=algo.prefilter_min_seen,
                   margin=algo.prefilter_margin, revisit=algo.prefilter_revisit)
