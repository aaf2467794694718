"""The ε_high pilot grid (`configs/ladder.py --sweep=eps_pilot`), read: for each setting, does
Clip-Higher (ε_high 0.28 against 0.20) move the tail entropy, and how often does the upper clip
bind? Exploratory: a pilot looks for a regime worth registering, it decides nothing.

A run is named `<setting>_eps<ε_high>_s<seed>`; a setting's effect is the paired difference
(0.28 − 0.20) over the seeds both arms finished, with d = mean / SD of those differences (the
paired effect size the power analysis plans with; its bias at 3 seeds is large, so a pilot's d
overstates).
"""
from __future__ import annotations

import math
import re

import numpy as np

from dapo_jax.analysis import ablations

ARMS = (0.20, 0.28)          # ε_high without and with Clip-Higher
TARGET_D = 1.5               # the effect a setting must show to be worth registering
_NAME = re.compile(r"^(?P<setting>.+)_eps(?P<eps>\d+\.\d+)$")


def _arms(runs: dict) -> dict:
  """{setting: {ε_high: {seed: RunLog}}} of the finished runs."""
  out: dict = {}
  for run in runs.values():
    m = _NAME.match(run.group)
    if m is None or not run.results.get("after"):
      continue
    out.setdefault(m.group("setting"), {}).setdefault(float(m.group("eps")), {})[run.seed] = run
  return out


def _mean(values) -> float:
  vals = [v for v in values if v is not None]
  return float(np.mean(vals)) if vals else math.nan


def table(runs: dict, *, metric: str = "avg@8") -> list[dict]:
  """One row per setting: seeds paired, each arm's tail entropy, entropy slope, upper-clip
  share (clipfrac_upper over the run) and held-out `metric` after, and the paired entropy
  difference with its d."""
  rows = []
  for setting, arms in sorted(_arms(runs).items()):
    lo, hi = (arms.get(e, {}) for e in ARMS)
    seeds = sorted(set(lo) & set(hi))
    row = {"setting": setting, "seeds": seeds}
    for e, arm in zip(ARMS, (lo, hi)):
      chosen = [arm[s] for s in seeds]
      row[f"entropy_tail_{e:.2f}"] = _mean(ablations.tail_mean(r, "entropy") for r in chosen)
      row[f"entropy_slope_{e:.2f}"] = _mean(ablations.slope(r, "entropy") for r in chosen)
      row[f"upclip_{e:.2f}"] = _mean(ablations.run_mean(r, "clipfrac_upper") for r in chosen)
      row[f"{metric}_{e:.2f}"] = _mean(r.final_eval(metric) for r in chosen)
    diffs = np.array([ablations.tail_mean(hi[s], "entropy") - ablations.tail_mean(lo[s], "entropy")
                      for s in seeds], np.float64)
    row["entropy_diff"] = float(diffs.mean()) if diffs.size else math.nan
    sd = float(diffs.std(ddof=1)) if diffs.size > 1 else math.nan
    row["entropy_d"] = row["entropy_diff"] / sd if sd and math.isfinite(sd) else math.nan
    row["acts"] = bool(math.isfinite(row["entropy_d"]) and abs(row["entropy_d"]) >= TARGET_D)
    rows.append(row)
  return rows


def render(rows: list[dict], *, metric: str = "avg@8") -> str:
  """The table as text, one line per setting."""
  head = (f"{'setting':<16}{'seeds':>6}  {'entropy tail 0.20 / 0.28':>25}  {'diff':>8}  "
          f"{'d':>6}  {'upper clip 0.20 / 0.28':>24}  {metric + ' 0.20 / 0.28':>20}")
  lines = [head]
  for r in rows:
    clip = [f"{100 * r[f'upclip_{e:.2f}']:.3f}%" for e in ARMS]
    lines.append(
        f"{r['setting']:<16}{len(r['seeds']):>6}  "
        f"{r['entropy_tail_0.20']:>12.4f} / {r['entropy_tail_0.28']:<10.4f}  "
        f"{r['entropy_diff']:>+8.4f}  {r['entropy_d']:>6.2f}  "
        f"{clip[0]:>11} / {clip[1]:<10}  "
        f"{r[f'{metric}_0.20']:>9.3f} / {r[f'{metric}_0.28']:<8.3f}")
  return "\n".join(lines)
