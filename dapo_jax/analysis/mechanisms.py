"""Does a ladder claim's mechanism act? What each technique acts on, read from pilot runs.

A claim can only be decided when its technique has something to act on: tokens the upper clip
binds on (Clip-Higher), responses at the length limit (the overlong filter and the soft
punishment), a spread of response lengths (the token-level loss), uniform groups (dynamic
sampling, Fig. 3b). Each measure is a train metric summarised per run (ablations.ENDPOINTS'
names); a measure with a floor is "reached" when every pilot seed reaches it. The floors are a
judgment, set by hand as the smallest share taken to act (the clip's 0.1 % of tokens sits above
the first ladder's 0.03 %); they are stated so that a reader can apply others.

Reaching a floor shows that the technique has something to act on. For Clip-Higher that is not
yet that it acts: the upper clip binding at ε_high 0.28 says there is a clip to widen, and only
a pilot arm at 0.20 beside it would show widening it change the update. Such a technique's
`acts` is None (not shown) and `needs` names the missing contrast; the pilots have no 0.20 arm.
"""
import dataclasses

import numpy as np

from dapo_jax.analysis import ablations


@dataclasses.dataclass(frozen=True)
class Measure:
  metric: str          # "<train key>:<endpoint>", endpoint one of ENDPOINTS
  subject: str         # what it counts, in words
  floor: float | None  # the mechanism acts when every pilot seed reaches it; None: descriptive


ENDPOINTS = {"run_mean": ablations.run_mean, "slope": ablations.slope,
             "tail": ablations.tail_mean}
_CLIP = Measure("clipfrac_upper:run_mean", "share of tokens the upper clip binds on", 0.001)
_TRUNC = Measure("truncated_frac:run_mean", "share of responses cut at the length limit", 0.01)
# the token-level loss reweights only where lengths differ: p90 length over mean length
_SPREAD = Measure("length_p90_over_mean:run_mean", "p90 / mean response length", 1.2)
_ALL_RIGHT = Measure("frac_groups_acc_1:run_mean", "share of generated groups all-correct", 0.01)
_ALL_WRONG = Measure("frac_groups_acc_0:run_mean", "share of generated groups all-wrong", 0.01)
_TREND = Measure("frac_groups_acc_1:slope", "all-correct share's trend per step", None)
# techniques whose action is a contrast the pilot must contain, beyond a floor reached
NEEDS = {"clip_higher": "a pilot arm at eps_high 0.20 beside the 0.28 one (the upper clip "
                        "binding at 0.28 is a clip to widen, not the widening acting)"}
# a claim's technique, by the arm that adds it (the claim's `a`; Fig. 3b: token_level vs 0)
BY_ARM = {"clip_higher": (_CLIP,), "overlong_filter": (_TRUNC,), "soft_overlong": (_TRUNC,),
          "token_level": (_SPREAD,), "dapo": (_ALL_RIGHT, _ALL_WRONG)}
FIG3B = (_ALL_RIGHT, _TREND)


def measures_of(record: dict) -> tuple[Measure, ...]:
  """The measures of a verdicts.json record's technique (ValueError for an unknown arm)."""
  if record["b"] is None and record["metric"].startswith("frac_groups_acc_1"):
    return FIG3B
  if record["a"] not in BY_ARM:
    raise ValueError(f"analysis_mechanisms: no mechanism for arm {record['a']!r}; expected one "
                     f"of {sorted(BY_ARM)}")
  return BY_ARM[record["a"]]


def value(run: ablations.RunLog, metric: str) -> float | None:
  """A run's value of a measure's metric (length_p90_over_mean: per step, then summarised)."""
  key, _, endpoint = metric.partition(":")
  if key == "length_p90_over_mean":
    steps, p90 = run.series("response_length_p90")
    ratio = p90 / np.maximum(run.series("response_length_mean")[1], 1e-9)
    run = dataclasses.replace(run, train=[{"step": s, key: float(v)}
                                          for s, v in zip(steps, ratio)])
  return ENDPOINTS[endpoint](run, key)


def evidence(record: dict, pilot_runs: list, first_runs: dict, *, pilot: str) -> dict:
  """The record's `mechanism` field: each measure per pilot seed, beside its mean in the first
  ladder's runs of the same arm (`first_runs`: arm -> runs); acts: every floored measure
  reached in every pilot seed (False without pilot runs), or None with `needs` where the
  technique's action needs a contrast the pilot lacks (NEEDS)."""
  rows = []
  for m in measures_of(record):
    per_seed = [value(r, m.metric) for r in sorted(pilot_runs, key=lambda r: r.seed)]
    first = [value(r, m.metric) for r in first_runs.get(record["a"], [])]
    rows.append({"metric": m.metric, "subject": m.subject, "floor": m.floor,
                 "pilot": per_seed, "first_ladder_mean": float(np.mean(first)) if first else None,
                 "reached": None if m.floor is None else bool(
                     per_seed and all(v is not None and v >= m.floor for v in per_seed))})
  out = {"pilot": pilot, "pilot_seeds": len(pilot_runs), "measures": rows,
         "acts": all(r["reached"] for r in rows if r["reached"] is not None)}
  if record["a"] in NEEDS and out["acts"]:
    out.update(acts=None, needs=NEEDS[record["a"]])
  return out
