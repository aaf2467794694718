"""Confirmatory verdicts: a pre-registration's claims decided by its own design, and nothing else.

A registration (experiments/preregistration/<campaign>.json, committed before any of its runs)
names the campaign's arms, its fresh seeds in the order they run, the looks (numbers of
complete seeds), the family's α, and the claims: arms a and b (b null: a against 0), endpoint
(`ablations.endpoint`'s metric) and the paper's direction. `decide` applies it to the runs under
experiments/results/<runs>/<arm>_s<seed>/:

- a look of n seeds is taken only when every arm of the first n registered seeds has finished
  (results.json with "after"); seeds past the last look taken, and every other run, are unused;
- at each look, every claim's paired two-sided t test over those seeds, its sequential p-value
  (O'Brien–Fleming, sequential.sequential_p) and Holm's adjustment of the family's
  sequential p-values (p_adj); a claim whose p_adj is at most α is decided at that look, and
  stays decided (its later data are not read);
- the campaign stops at the look where every claim is decided, or at the last look;
- a decided claim reads `reproduced` when its difference (at the look it crossed) has the
  paper's sign, `refuted` otherwise; one undecided after the last look is `bounded`, with its
  repeated confidence interval at the last look's level for α / (claims undecided), the set
  of effects the design does not exclude; before that, `undecided` (the same interval at the
  current look). A decided claim's repeated interval is at α / m (Bonferroni's, conservative).
"""
import dataclasses
import json
import math
import os

from dapo_jax.analysis import ablations, sequential
from dapo_jax.analysis.stats import holm

CONFIRM_VERDICTS = ("reproduced", "refuted", "bounded", "undecided")
_KEYS = {"campaign", "registered", "family", "runs", "config", "base", "steps", "overrides",
         "arms", "seeds", "looks", "alpha", "boundary", "multiplicity", "analysis_commit",
         "claims", "stopping", "failed_runs", "exploratory"}
_CLAIM_KEYS = {"id", "claim", "a", "b", "metric", "expected", "planning"}


@dataclasses.dataclass(frozen=True)
class Claim:
  id: str
  claim: str
  a: str
  b: str | None
  metric: str
  expected: str


@dataclasses.dataclass(frozen=True)
class Registration:
  path: str
  campaign: str
  family: str
  runs: str                  # the directory under experiments/results/ holding the runs
  arms: tuple
  seeds: tuple               # in the order they run; the first looks[k] make look k
  looks: tuple
  alpha: float
  analysis_commit: str
  claims: tuple
  raw: dict                  # the file as read (config, overrides, stopping, ...)

  @property
  def fractions(self) -> list[float]:
    return [n / self.looks[-1] for n in self.looks]

  def run_names(self) -> list[str]:
    """Every registered run, seed-major (the order the campaign launches them)."""
    return [f"{arm}_s{seed}" for seed in self.seeds for arm in self.arms]


def load_registration(path: str) -> Registration:
  """The registration at `path`, checked: exactly the known keys, claims on registered arms,
  distinct seeds, looks rising to the number of seeds. A bad file is an error naming it."""
  with open(path, encoding="utf-8") as f:
    raw = json.load(f)
  def bad(msg):
    return ValueError(f"{path}: {msg}")
  if set(raw) != _KEYS:
    raise bad(f"keys {sorted(set(raw) ^ _KEYS)} missing or unknown (expected {sorted(_KEYS)})")
  seeds, looks, arms = tuple(raw["seeds"]), tuple(raw["looks"]), tuple(raw["arms"])
  if len(set(seeds)) != len(seeds) or not all(isinstance(s, int) for s in seeds):
    raise bad(f"seeds must be distinct integers, got {list(seeds)}")
  if (not looks or any(b <= a for a, b in zip(looks, looks[1:])) or looks[0] < 2
      or looks[-1] != len(seeds)):
    raise bad(f"looks must rise from >= 2 to the number of seeds ({len(seeds)}), got "
              f"{list(looks)}")
  if raw["boundary"] != "obrien_fleming" or raw["multiplicity"] != "holm":
    raise bad(f"only boundary obrien_fleming and multiplicity holm are implemented, got "
              f"{raw['boundary']!r} / {raw['multiplicity']!r}")
  if not 0 < raw["alpha"] < 1:
    raise bad(f"alpha must lie in (0, 1), got {raw['alpha']}")
  claims = []
  for i, c in enumerate(raw["claims"]):
    if set(c) != _CLAIM_KEYS:
      raise bad(f"claims[{i}]: keys {sorted(set(c) ^ _CLAIM_KEYS)} missing or unknown")
    if c["a"] not in arms or (c["b"] is not None and c["b"] not in arms):
      raise bad(f"claims[{i}] ({c['id']}): arms {c['a']!r} / {c['b']!r} not among {list(arms)}")
    if c["expected"] not in ("higher", "lower"):
      raise bad(f"claims[{i}] ({c['id']}): expected must be 'higher' or 'lower'")
    claims.append(Claim(c["id"], c["claim"], c["a"], c["b"], c["metric"], c["expected"]))
  if len({c.id for c in claims}) != len(claims) or not claims:
    raise bad("claim ids must be distinct, and there must be at least one claim")
  return Registration(path, raw["campaign"], raw["family"], raw["runs"], arms, seeds, looks,
                      float(raw["alpha"]), raw["analysis_commit"], tuple(claims), raw)


def finished_seeds(reg: Registration, runs: dict) -> list[int]:
  """The registered seeds, in order, up to the first one some arm has not finished."""
  done = []
  for seed in reg.seeds:
    rs = [runs.get(f"{arm}_s{seed}") for arm in reg.arms]
    if not all(r is not None and r.results.get("after") for r in rs):
      break
    for r in rs:
      cfg_seed = r.config.get("seed") if r.config else seed
      if cfg_seed != seed:
        raise ValueError(f"{r.name}: config.json has seed {cfg_seed}, the name says {seed}")
    done.append(seed)
  return done


def _test(claim: Claim, runs: dict, seeds) -> tuple:
  def values(arm):
    return {s: ablations.endpoint(runs[f"{arm}_s{s}"], claim.metric) for s in seeds}
  a = values(claim.a)
  b = values(claim.b) if claim.b is not None else None
  missing = [s for s in seeds if a[s] is None or (b is not None and b[s] is None)]
  if missing:
    raise ValueError(f"{claim.id}: metric {claim.metric!r} missing in seeds {missing}")
  return ablations.paired_test(a, b)


def _run_looks(reg: Registration, runs: dict, done: list[int], looks: list[int]) -> tuple:
  """The registered looks in order, each on the first n complete seeds, until every claim is
  decided: per claim its TTest per look it was tested at, the look index that decided it, and
  its Holm-adjusted sequential p at its last look."""
  t = reg.fractions
  m = len(reg.claims)
  tests = {c.id: [] for c in reg.claims}     # per look taken: TTest over its seeds
  decided_at: dict[str, int] = {}            # claim id -> index of the look that decided it
  adjusted = {c.id: math.nan for c in reg.claims}
  for k, n in enumerate(looks):
    if len(decided_at) == m:
      break                                  # every claim decided: the campaign stopped
    for c in reg.claims:
      if c.id not in decided_at:
        tests[c.id].append(_test(c, runs, done[:n]))
    q = [sequential.sequential_p([x.p for x in tests[c.id]], t) for c in reg.claims]
    for c, p_adj in zip(reg.claims, holm(q)):
      if c.id not in decided_at:
        adjusted[c.id] = p_adj
        if p_adj <= reg.alpha:
          decided_at[c.id] = k
  return tests, decided_at, adjusted


def _outcome(reg: Registration, c: Claim, tests: list, p_adj: float, decided: bool,
             left: int, final: bool) -> dict:
  """One tested claim's verdict fields: the look it crossed at (or its last), that look's test
  and the repeated CI at the level it was held to."""
  t = reg.fractions
  m = len(reg.claims)
  ps = [x.p for x in tests]
  if decided:
    # the look whose boundary it crossed at its level: the first whose own sequential p
    # reaches the adjusted value (recycled alpha can decide it at a later look)
    k_cross = next(j for j in range(len(ps))
                   if sequential.sequential_p(ps[:j + 1], t)
                   <= sequential.sequential_p(ps, t) * (1 + 1e-9))
    x = tests[k_cross]
    verdict = "reproduced" if (x.diff > 0) == (c.expected == "higher") else "refuted"
    level = sequential.nominal_levels(reg.alpha / m, t)[k_cross]  # Bonferroni's
  else:
    k_cross = len(ps) - 1
    x = tests[k_cross]
    level = sequential.nominal_levels(reg.alpha / left, t)[k_cross]
    verdict = "bounded" if final else "undecided"
  lo, hi = sequential.repeated_ci(diff=x.diff, sd=x.sd, n=x.n, level_p=level)
  return dict(look=k_cross + 1, seeds=x.n, diff=x.diff, ci_low=x.diff - x.half,
              ci_high=x.diff + x.half, sd_diff=x.sd, p=x.p, p_by_look=ps,
              q=sequential.sequential_p(ps, t), p_adj=p_adj, repeated_ci_low=lo,
              repeated_ci_high=hi, repeated_ci_level=level, verdict=verdict)


def decide(reg: Registration, runs: dict) -> list[dict]:
  """verdicts.json's confirmatory records, one per registered claim (module docstring)."""
  done = finished_seeds(reg, runs)
  looks = [n for n in reg.looks if n <= len(done)]
  tests, decided_at, adjusted = _run_looks(reg, runs, done, looks)
  taken = max(len(v) for v in tests.values())
  final = taken == len(reg.looks)
  left = len(reg.claims) - len(decided_at)
  out = []
  for c in reg.claims:
    rec = {"phase": "confirmatory", "family": reg.family, "runs": reg.runs, "id": c.id,
           "claim": c.claim, "a": c.a, "b": c.b, "metric": c.metric, "expected": c.expected,
           "registration": reg.campaign, "analysis_commit": reg.analysis_commit,
           "looks_registered": list(reg.looks), "looks_taken": looks[:taken], "alpha": reg.alpha}
    if not tests[c.id]:
      rec.update(verdict="undecided", seed_list=[], seeds=0, p=None, p_adj=None)
    else:
      got = _outcome(reg, c, tests[c.id], adjusted[c.id], c.id in decided_at, left, final)
      look = got.pop("look")
      rec.update(look=look, seed_list=done[:looks[look - 1]], **got)
    out.append(rec)
  return out


def plan(reg: Registration) -> list[dict]:
  """Per claim: the power of the registered design at its planning effects (each claim alone
  at α / m, the level Holm holds the first rejection to; recycling only adds power)."""
  rows = []
  for c in reg.raw["claims"]:
    for label, effect in c["planning"]["effects"].items():
      rows.append({"id": c["id"], "effect_label": label, "effect": effect,
                   "power": sequential.power(effect=effect, looks=reg.looks,
                                                      alpha=reg.alpha / len(reg.claims))})
  return rows
