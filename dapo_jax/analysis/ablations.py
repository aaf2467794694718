"""Reading sweep logs for the ablation notebook: runs, per-run endpoints, claims and verdicts.

A sweep directory holds one sub-directory per run (<name>_s<seed>) with metrics.jsonl (one JSON
record per rollout step, kind "train", and per evaluation, kind "eval") and results.json.
The tests themselves (t intervals and p-values, Holm's correction, power) are in
analysis_stats.py; a claim's verdict is read from its Holm-adjusted p within its family.
"""
import dataclasses
import json
import math
import os
import re

import numpy as np

from dapo_jax.analysis.stats import (  # noqa: F401  (VERDICTS, holm, power_t re-exported)
    ALPHA, NAN, VERDICTS, TTest, hedges_j, holm, one_sample_t, power_t, seeds_needed, verdict,
    welch_t)


@dataclasses.dataclass
class RunLog:
  name: str
  group: str                 # the name without its _s<seed> suffix
  seed: int
  train: list                # kind == "train" records, by step
  evals: list                # kind == "eval" records
  results: dict              # results.json ({} while running)
  config: dict = dataclasses.field(default_factory=dict)  # config.json ({} where absent)

  def series(self, key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], r[key]) for r in self.train if isinstance(r.get(key), (int, float))]
    if not pts:
      return np.zeros(0), np.zeros(0)
    s, v = zip(*pts)
    return np.asarray(s), np.asarray(v, np.float64)

  def final_eval(self, metric: str) -> float | None:
    after = self.results.get("after") or next(
        (e for e in reversed(self.evals) if e.get("tag") == "after"), None)
    return None if not after or metric not in after else float(after[metric])

  def before_eval(self, metric: str) -> float | None:
    before = self.results.get("before") or next(
        (e for e in self.evals if e.get("tag") == "before"), None)
    return None if not before or metric not in before else float(before[metric])


_NAME_RE = re.compile(r"^(?P<group>.+)_s(?P<seed>\d+)$")


def load_runs(root: str) -> dict[str, RunLog]:
  """All runs under `root` that have a metrics.jsonl; a bad line is an error naming the file."""
  runs = {}
  if not os.path.isdir(root):
    raise FileNotFoundError(f"{root}: no such sweep directory")
  for name in sorted(os.listdir(root)):
    path = os.path.join(root, name, "metrics.jsonl")
    if not os.path.isfile(path):
      continue
    train, evals = [], []
    with open(path, encoding="utf-8") as f:
      for i, line in enumerate(f, 1):
        try:
          rec = json.loads(line)
        except json.JSONDecodeError as err:
          raise ValueError(f"{path}:{i}: not JSON ({err})") from None
        (train if rec.get("kind") == "train" else evals).append(rec)
    res_path = os.path.join(root, name, "results.json")
    results = {}
    if os.path.isfile(res_path):
      with open(res_path, encoding="utf-8") as f:
        results = json.load(f)
    cfg_path = os.path.join(root, name, "config.json")
    config = {}
    if os.path.isfile(cfg_path):
      with open(cfg_path, encoding="utf-8") as f:
        config = json.load(f)
    m = _NAME_RE.match(name)
    group, seed = (m.group("group"), int(m.group("seed"))) if m else (name, 0)
    runs[name] = RunLog(name, group, seed, sorted(train, key=lambda r: r["step"]), evals, results,
                        config)
  return runs


def mean_ci(values) -> tuple[float, float, int]:
  """(mean, half-width of the 95 % t interval, n) over seeds; half-width nan for n < 2."""
  t = one_sample_t(values)
  return t.diff, t.half, t.n


def by_group(runs: dict[str, RunLog]) -> dict[str, list[RunLog]]:
  out: dict[str, list[RunLog]] = {}
  for r in runs.values():
    out.setdefault(r.group, []).append(r)
  return out


def tail_mean(run: RunLog, key: str, frac: float = 0.34) -> float | None:
  """Mean of a train metric over the last `frac` of the run's steps."""
  _, v = run.series(key)
  if v.size == 0:
    return None
  k = max(1, int(round(frac * v.size)))
  return float(v[-k:].mean())


def run_mean(run: RunLog, key: str) -> float | None:
  """Mean of a train metric over every step (whole-run training accuracy: gen_accuracy)."""
  _, v = run.series(key)
  return float(v.mean()) if v.size else None


def slope(run: RunLog, key: str) -> float | None:
  """Least-squares slope of a train metric against the step (per rollout step): its trend."""
  s, v = run.series(key)
  if v.size < 2:
    return None
  return float(np.polyfit(s.astype(np.float64), v, 1)[0])


def largest_drop(run: RunLog, key: str) -> float | None:
  """The largest step-to-step fall of a train metric, max_t (v[t-1] − v[t]) (negative when it
  only rises): how sharply it can drop, the stability Fig. 5b reads for entropy."""
  _, v = run.series(key)
  return float(np.max(v[:-1] - v[1:])) if v.size >= 2 else None


def budget_mean(run: RunLog, key: str, *, tokens: float) -> float | None:
  """run_mean over the steps taken before the run's generated tokens (cumulative gen_tokens)
  exceed `tokens`: the run read at another run's generation budget (compute-matched)."""
  s_tok, tok = run.series("gen_tokens")
  s_key, v = run.series(key)
  if tok.size == 0 or v.size == 0 or not np.array_equal(s_tok, s_key):
    return None
  n = int(np.sum(np.cumsum(tok) <= tokens))
  return float(v[:n].mean()) if n else None


ENDPOINTS = {"tail": tail_mean, "slope": slope, "largest_drop": largest_drop,
             "run_mean": run_mean}


def endpoint(run: RunLog, metric: str) -> float | None:
  """One run's value of a claim's endpoint: "<key>" is the held-out eval after training,
  "<key>:<endpoint>" a train metric summarised per run by ENDPOINTS[endpoint] (tail: mean of
  the last third of the steps; slope: least-squares trend per step; run_mean: every step's
  mean; largest_drop: the largest step-to-step fall). None where the run lacks it."""
  key, _, how = metric.partition(":")
  if not how:
    return run.final_eval(key)
  if how not in ENDPOINTS:
    raise ValueError(f"endpoint {metric!r}: unknown summary {how!r}; expected one of "
                     f"{sorted(ENDPOINTS)}")
  return ENDPOINTS[how](run, key)


def paired_test(a: dict, b: dict | None) -> TTest:
  """a − b over seeds ({seed: value}): the paired t test when both hold the same seeds (runs
  with one seed share the eval problems and the prompt order), Welch's otherwise; b None
  tests a's values against 0."""
  if b is None:
    return one_sample_t(list(a.values()))
  seeds = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
  if len(seeds) >= 2 and len(seeds) == len(a) == len(b):
    return one_sample_t([a[s] - b[s] for s in seeds])
  return welch_t(list(a.values()), list(b.values()))


def claim_record(claim: str, metric: str, a: str, b: str | None, values_a: dict,
                 values_b: dict | None, expected: str, *, family: str) -> dict:
  """One row of verdicts.json before its family's correction (adjust_family adds p_adj, the
  verdict and the seeds needed): a − b over seeds (b None: a against 0), the unadjusted 95 %
  interval and two-sided p, for a claim that expects a to be `expected` than b."""
  if expected not in ("higher", "lower"):
    raise ValueError(f"claim_record {claim!r}: expected must be 'higher' or 'lower', "
                     f"got {expected!r}")
  t = paired_test(values_a, values_b)
  return {"claim": claim, "family": family, "metric": metric, "a": a, "b": b,
          "expected": expected, "diff": t.diff, "ci_low": t.diff - t.half,
          "ci_high": t.diff + t.half, "p": t.p, "sd_diff": t.sd, "seeds": t.n,
          "paired": t.paired}


def adjust_family(records: list[dict], *, alpha: float = ALPHA) -> list[dict]:
  """The records with, within each family: p_adj (Holm), the verdict read from p_adj, and
  seeds_needed_80, the seeds a paired t test needs for 80 % power at alpha / m (m the family's
  size: the level Holm holds the family's smallest p to) for the observed mean difference and
  sd of the differences; seeds_needed_80_raw is the same at alpha unadjusted. Those plug in the
  observed effect, which a few seeds overstate (E[d̂] = δ / J); seeds_needed_80_bc plans at
  alpha / m with the bias-corrected effect J·d̂ (Hedges' J, analysis_stats.hedges_j), the count
  to plan a fresh campaign with."""
  out = [dict(r) for r in records]
  families: dict[str, list[int]] = {}
  for i, r in enumerate(out):
    families.setdefault(r["family"], []).append(i)
  for idx in families.values():
    alpha_plan = alpha / len(idx)
    for i, p_adj in zip(idx, holm([out[i]["p"] for i in idx])):
      r = out[i]
      effect = _effect(r["diff"], r["sd_diff"]) if r["paired"] else NAN
      corrected = effect * hedges_j(r["seeds"]) if r["paired"] and r["seeds"] >= 3 else NAN
      r.update(p_adj=p_adj, alpha_plan=alpha_plan,
               verdict=verdict(diff=r["diff"], p_adj=p_adj, expected=r["expected"], alpha=alpha),
               seeds_needed_80=seeds_needed(effect=effect, alpha=alpha_plan),
               seeds_needed_80_raw=seeds_needed(effect=effect, alpha=alpha),
               seeds_needed_80_bc=seeds_needed(effect=corrected, alpha=alpha_plan))
  return out


def _effect(diff: float, sd: float) -> float:
  """The standardized mean difference diff / sd (inf when every difference is the same)."""
  if not (math.isfinite(diff) and math.isfinite(sd)):
    return NAN
  return diff / sd if sd > 0 else (math.inf if diff else 0.0)


def write_verdicts(records: list[dict], path: str):
  """verdicts.json: the adjusted records as a JSON list (NaN written as null)."""
  missing = [r["claim"] for r in records if "p_adj" not in r]
  if missing:
    raise ValueError(f"write_verdicts: records not adjusted within their family (run "
                     f"adjust_family first): {missing}")
  clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in r.items()} for r in records]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(clean, f, indent=1)
    f.write("\n")
