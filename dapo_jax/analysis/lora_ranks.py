"""The LoRA rank sweep (`configs/ladder.py --sweep=lora_ranks`) read against full-weight
training: for each adapter rank, held-out accuracy after training, its gain over the base, and
the paired difference from the full-weight DAPO runs of the same seeds (the ladder's `dapo_s*`,
the same rung, base and seeds). Exploratory: one learning rate per arm, a few seeds, no
registration; it describes, it decides nothing.

A LoRA run is named `lora_r<rank>_s<seed>` (the sweep's 10x learning rate) or, from the
`lora_lr` sweep, `lora_r<rank>_lr<factor>x_s<seed>` (factor x the rung's). Differences are
paired by seed (the same eval problems and prompt order): a one-sample t test
(`stats.one_sample_t`, its 95 % interval and p) over the seeds both finished, Holm over the
table's adapter arms. Beside accuracy, what the logs say of each arm's updates: `approx_kl`
(how far one update moved the policy, a run's mean over its steps) and the entropy of its last
steps.
"""
from __future__ import annotations

import math
import re

from dapo_jax.analysis import ablations, stats

FULL = "dapo"                # the full-weight arm's group in the ladder
_NAME = re.compile(r"^lora_r(?P<rank>\d+)(?:_lr(?P<factor>\d+)x)?$")
LR_FACTOR = 10               # the lora_ranks sweep's (configs/ladder.py LORA_LR_FACTOR)


def _finished(run: ablations.RunLog, metric: str) -> bool:
  return run.final_eval(metric) is not None and run.before_eval(metric) is not None


def table(lora_runs: dict, full_runs: dict, *, metric: str = "avg@8") -> list[dict]:
  """Rows, the full-weight arm first (on the seeds some adapter arm finished) and then by rank
  and learning-rate factor: seeds, `metric` before and after (means over the arm's finished
  seeds), the gain, and for adapters the paired difference from full weights over the seeds
  both finished (mean, 95 % CI half-width, two-sided t p; nan below 2 seeds), its Holm p
  over the table's adapter arms, and the arm's runs without a final eval (`unfinished`: a run
  that stopped early is named, not averaged in)."""
  full = {r.seed: r for r in full_runs.values() if r.group == FULL and _finished(r, metric)}
  arms: dict = {}
  unfinished: dict = {}  # runs that stopped early or still run: named, never averaged in
  for r in lora_runs.values():
    m = _NAME.match(r.group)
    if m:
      key = int(m.group("rank")), int(m.group("factor") or LR_FACTOR)
      if _finished(r, metric):
        arms.setdefault(key, {})[r.seed] = r
      else:
        unfinished.setdefault(key, []).append(r.seed)
  used = {s for arm in arms.values() for s in arm}  # the full arm on the sweep's seeds
  shown = {s: r for s, r in full.items() if s in used} if used else full
  rows = [_row("full", shown, metric)] if shown else []
  for rank, factor in sorted(arms):
    arm = arms[rank, factor]
    label = f"rank {rank}" + ("" if factor == LR_FACTOR else f" {factor}x")
    row = _row(label, arm, metric)
    row["unfinished"] = sorted(unfinished.get((rank, factor), []))
    seeds = sorted(set(arm) & set(full))
    t = stats.one_sample_t([arm[s].final_eval(metric) - full[s].final_eval(metric)
                            for s in seeds])
    row.update(paired_seeds=t.n, minus_full=t.diff, minus_full_ci=t.half, p=t.p)
    rows.append(row)
  adapters = rows[1:] if shown else rows
  for row, p_adj in zip(adapters, stats.holm([r["p"] for r in adapters])):
    row["p_holm"] = p_adj  # Holm over the table's adapter arms: one family
  return rows


LAST_STEPS = 5  # entropy_end: the mean over a run's last LAST_STEPS train records


def _mean(xs) -> float:
  xs = [x for x in xs if not math.isnan(x)]
  return sum(xs) / len(xs) if xs else math.nan


def _or_nan(value: float | None) -> float:
  return math.nan if value is None else value


def _last_mean(run: ablations.RunLog, key: str, last: int) -> float:
  values = run.series(key)[1][-last:]
  return float(values.mean()) if values.size else math.nan


def _row(arm: str, runs: dict, metric: str) -> dict:
  seeds = sorted(runs)
  before = _mean([runs[s].before_eval(metric) for s in seeds])
  after = _mean([runs[s].final_eval(metric) for s in seeds])
  kl = [_or_nan(ablations.run_mean(runs[s], "approx_kl")) for s in seeds]
  return {"arm": arm, "seeds": seeds, f"{metric}_before": before, f"{metric}_after": after,
          "gain": after - before, "approx_kl": _mean(kl), "approx_kl_per_seed": kl,
          "entropy_end": _mean([_last_mean(runs[s], "entropy", LAST_STEPS) for s in seeds])}


def render(rows: list[dict], metric: str = "avg@8") -> str:
  head = (f"{'arm':<14}{'seeds':>6}   {metric} before -> after     gain   approx_kl  "
          "entropy_end   minus full [95 % CI] (paired seeds)  Holm p")
  lines = [head]
  for r in rows:
    cmp = ""
    if "minus_full" in r:
      d, h = r["minus_full"], r["minus_full_ci"]
      ci = "" if math.isnan(h) else f" [{d - h:+.3f}, {d + h:+.3f}]"
      cmp = f"{d:+.3f}{ci} ({r['paired_seeds']})"
      if not math.isnan(r["p_holm"]):
        cmp += f"  Holm p {r['p_holm']:.3f}"
      if r["unfinished"]:
        cmp += f"  (unfinished: seed {', '.join(map(str, r['unfinished']))})"
    lines.append(f"{r['arm']:<14}{len(r['seeds']):>6}   {r[metric + '_before']:.3f} -> "
                 f"{r[metric + '_after']:.3f}   {r['gain']:+.3f}   {r['approx_kl']:9.5f}  "
                 f"{r['entropy_end']:11.3f}   {cmp}")
  return "\n".join(lines)
