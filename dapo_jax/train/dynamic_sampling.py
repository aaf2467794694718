"""Dynamic sampling (DAPO §3.2): over-generate until the batch holds only mixed groups.

Each round samples `gen_batch_size` prompts × G responses; groups with 0 < #correct < G (on the
verifier's correctness, never the shaped reward) are kept. Rounds repeat until `batch_size` groups
are held; the batch is cut to exactly that and the surplus is discarded (as the reference does;
it is counted). After `max_gen_rounds` rounds without a full batch the step fails with the
acceptance statistics. Every round's metrics are kept.

Generation cost (the paper's "does not impede efficiency" claim, measured): `gen_tokens` counts
every round's responses; `gen_tokens_per_kept_group` divides it by the groups that carry signal
into the update (the batch's mixed groups: all of it with dynamic sampling, only its mixed
groups without, since uniform groups get zero advantage; none counts as one);
`gen_groups_discarded_frac` is the share of generated groups that never reach the update and
`gen_tokens_discarded_frac` the share of generated tokens they hold; `gen_rounds` is the rounds
this step took. `gen_format_rate` is the share of generated responses the verifier could read an
answer from (what a real model learns first).
"""
from typing import Callable

import numpy as np

from dapo_jax.core import filtering
from dapo_jax.train.groups import Groups


class DynamicSamplingError(RuntimeError):
  """Too few mixed groups after the allowed number of generation rounds."""


def round_metrics(g: Groups, keep_N) -> dict:
  shares = filtering.group_accuracy_stats(g.correct)  # Fig. 3b: all-correct / all-wrong groups
  return {"prompts": len(g), "accepted": int(np.sum(keep_N)),
          "frac_acc_1": float(shares["frac_groups_acc_1"]),
          "frac_acc_0": float(shares["frac_groups_acc_0"]),
          "accuracy": float(g.correct.mean()), "format_rate": float(g.parsed.mean()),
          "reward_mean": float(g.reward.mean()),
          "length_mean": float(g.lengths.mean()), "tokens": int(g.lengths.sum())}


class BatchFiller:
  """One batch collected a round at a time (`round()` until `done`, then `result()`), so a
  caller can interleave rounds with other work (train/pipeline.py).

  generate(round_index, num_prompts) samples and scores one round. Without dynamic sampling a
  single round of batch_size prompts is taken whole (uniform groups get zero advantage).
  """

  def __init__(self, generate: Callable[[int, int], Groups], *, batch_size: int,
               gen_batch_size: int, max_gen_rounds: int, dynamic: bool):
    self.generate, self.batch_size, self.dynamic = generate, batch_size, dynamic
    self.gen_batch_size, self.max_gen_rounds = gen_batch_size, max_gen_rounds
    self.held, self.rounds, self.n_held = [], [], 0
    self.batch: Groups | None = None
    self.summary: dict | None = None

  @property
  def done(self) -> bool:
    return self.batch is not None

  def round(self) -> None:
    """Samples the next round and keeps its mixed groups (the whole round without dynamic
    sampling); raises DynamicSamplingError when the last allowed round leaves it short."""
    r = len(self.rounds)
    g = self.generate(r, self.gen_batch_size if self.dynamic else self.batch_size)
    keep = np.asarray(filtering.mixed_groups(g.correct))
    self.rounds.append(round_metrics(g, keep))
    if not self.dynamic:
      self.batch = g
      self.summary = _summary(self.rounds, accepted_total=len(g), batch=g,
                              kept_groups=int(keep.sum()))
      return
    if keep.any():
      self.held.append(g.select(np.flatnonzero(keep)))
      self.n_held += int(keep.sum())
    if self.n_held >= self.batch_size:
      self.batch = Groups.concat(self.held).select(np.arange(self.batch_size))
      self.summary = _summary(self.rounds, accepted_total=self.n_held, batch=self.batch,
                              kept_groups=self.batch_size)
    elif r + 1 == self.max_gen_rounds:
      raise self._short()

  def result(self) -> tuple[Groups, dict, list]:
    """(batch Groups of exactly batch_size, summary metrics, per-round metrics)."""
    return self.batch, self.summary, self.rounds

  def _short(self) -> DynamicSamplingError:
    rounds, n_held = self.rounds, self.n_held
    sampled = sum(x["prompts"] for x in rounds)
    return DynamicSamplingError(
        f"dynamic sampling: {n_held} mixed groups after {self.max_gen_rounds} rounds of "
        f"{self.gen_batch_size} prompts (need algo batch of {self.batch_size}); acceptance "
        f"{n_held}/{sampled} = {n_held / max(sampled, 1):.3f}; per round "
        f"all-correct {[round(x['frac_acc_1'], 3) for x in rounds]}, all-wrong "
        f"{[round(x['frac_acc_0'], 3) for x in rounds]}. Raise algo.max_gen_rounds or "
        f"algo.gen_batch_size, or use an easier/harder task.")


def fill_batch(generate: Callable[[int, int], Groups], *, batch_size: int, gen_batch_size: int,
               max_gen_rounds: int, dynamic: bool):
  """Returns (batch Groups of exactly batch_size, summary metrics, per-round metrics): a
  BatchFiller run to the end."""
  filler = BatchFiller(generate, batch_size=batch_size, gen_batch_size=gen_batch_size,
                       max_gen_rounds=max_gen_rounds, dynamic=dynamic)
  while not filler.done:
    filler.round()
  return filler.result()


def _summary(rounds, *, accepted_total: int, batch: Groups, kept_groups: int) -> dict:
  """Per-step metrics over all rounds; `kept_groups`: the batch's groups with signal."""
  sampled, batch_size = sum(x["prompts"] for x in rounds), len(batch)
  gen_tokens = sum(x["tokens"] for x in rounds)  # every round's, discarded ones too
  w = np.array([x["prompts"] for x in rounds], np.float64)
  avg = lambda k: float(np.dot(w, [x[k] for x in rounds]) / w.sum())
  return {"gen_rounds": len(rounds), "prompts_sampled": sampled,
          "accepted_frac": accepted_total / max(sampled, 1),
          "surplus_discarded": max(accepted_total - batch_size, 0),
          "frac_groups_acc_1": avg("frac_acc_1"), "frac_groups_acc_0": avg("frac_acc_0"),
          "gen_accuracy": avg("accuracy"), "gen_format_rate": avg("format_rate"),
          "gen_reward_mean": avg("reward_mean"),
          "gen_length_mean": avg("length_mean"), "gen_tokens": gen_tokens,
          "gen_tokens_per_kept_group": gen_tokens / max(kept_groups, 1),
          "gen_groups_discarded_frac": 1.0 - batch_size / max(sampled, 1),
          "gen_tokens_discarded_frac": 1.0 - int(batch.lengths.sum()) / max(gen_tokens, 1)}
