"""Reading sweep logs for the ablation notebook: runs, per-rung statistics, verdicts.

A sweep directory holds one sub-directory per run (<name>_s<seed>) with metrics.jsonl (one JSON
record per rollout step, kind "train", and per evaluation, kind "eval") and results.json.
"""
import dataclasses
import json
import math
import os
import re

import numpy as np

# Two-sided 97.5 % Student-t quantiles for small seed counts (df = n - 1).
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
         9: 2.262, 10: 2.228}


@dataclasses.dataclass
class RunLog:
  name: str
  group: str                 # the name without its _s<seed> suffix
  seed: int
  train: list                # kind == "train" records, by step
  evals: list                # kind == "eval" records
  results: dict              # results.json ({} while running)

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
    m = _NAME_RE.match(name)
    group, seed = (m.group("group"), int(m.group("seed"))) if m else (name, 0)
    runs[name] = RunLog(name, group, seed, sorted(train, key=lambda r: r["step"]), evals, results)
  return runs


def mean_ci(values) -> tuple[float, float, int]:
  """(mean, half-width of the 95 % t interval, n) over seeds; half-width nan for n < 2."""
  x = np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)
  n = x.size
  if n == 0:
    return float("nan"), float("nan"), 0
  if n == 1:
    return float(x[0]), float("nan"), 1
  t = _T975.get(n - 1, 1.96)
  return float(x.mean()), float(t * x.std(ddof=1) / math.sqrt(n)), n


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


def compare(a: list[float], b: list[float]) -> tuple[float, float, str]:
  """Difference of means a − b with a Welch 95 % interval, and a one-word reading of it."""
  a = np.asarray([x for x in a if x is not None], np.float64)
  b = np.asarray([x for x in b if x is not None], np.float64)
  if a.size < 2 or b.size < 2:
    return float("nan"), float("nan"), "insufficient"
  d = a.mean() - b.mean()
  va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
  se = math.sqrt(va + vb)
  if se == 0:
    return float(d), 0.0, ("higher" if d > 0 else "lower" if d < 0 else "equal")
  dof = (va + vb) ** 2 / ((va ** 2) / (a.size - 1) + (vb ** 2) / (b.size - 1))
  half = _T975.get(int(max(1, min(10, math.floor(dof)))), 1.96) * se
  word = "higher" if d - half > 0 else "lower" if d + half < 0 else "overlapping"
  return float(d), float(half), word


def compare_paired(a: dict, b: dict) -> tuple[float, float, str]:
  """Mean of per-seed differences a[s] − b[s] with a 95 % t interval, and its reading.

  Runs with the same seed share the eval problems and the prompt order, so pairing removes
  most of the between-seed variance. Falls back to `compare` when the seeds do not match.
  """
  seeds = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
  if len(seeds) < 2 or len(seeds) != len(a) or len(seeds) != len(b):
    return compare(list(a.values()), list(b.values()))
  d, half, _ = mean_ci([a[s] - b[s] for s in seeds])
  if half != half:  # nan
    return d, half, "insufficient"
  word = "higher" if d - half > 0 else "lower" if d + half < 0 else "overlapping"
  return d, half, word


VERDICTS = ("reproduced", "refuted", "inconclusive")


def verdict(word: str, expected: str) -> str:
  """'reproduced' when the interval excludes 0 in the paper's direction, 'refuted' when it
  excludes 0 the other way, 'inconclusive' otherwise (including too few seeds)."""
  if word == expected:
    return "reproduced"
  if word in ("higher", "lower"):
    return "refuted"
  return "inconclusive"


def claim_record(claim: str, metric: str, a: str, b: str, values_a: dict, values_b: dict,
                 expected: str) -> dict:
  """One row of verdicts.json: the paired difference a − b over seeds, its 95 % interval and
  the verdict for a claim that expects a to be `expected` ("higher" | "lower") than b."""
  d, half, word = compare_paired(values_a, values_b)
  seeds = sorted(s for s in values_a if s in values_b)
  return {"claim": claim, "metric": metric, "a": a, "b": b, "diff": d,
          "ci_low": d - half, "ci_high": d + half, "seeds": len(seeds),
          "verdict": verdict(word, expected)}


def write_verdicts(records: list[dict], path: str):
  """verdicts.json: the records above as a JSON list (NaN written as null)."""
  clean = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v)
            for k, v in r.items()} for r in records]
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    json.dump(clean, f, indent=1)
    f.write("\n")
