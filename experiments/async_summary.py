"""The staleness sweep's table: accuracy and time per max_staleness k, paired by seed with k = 0.

COMMAND:
  python experiments/async_summary.py --root=experiments/results/async [--json=F]
EXPECTED: one row per k: finished seeds, held-out avg@8 after training (mean over seeds), its
  paired difference from k = 0 with the 95 % t interval, the raw p and Holm's p over the k >= 1
  comparisons (one family of the distinct tests: an arm whose per-seed results equal an earlier
  arm's bit for bit is the same computation and shares its test, and a comparison with no p —
  fewer than 2 paired seeds — is not a test), the policy lag the sampler reached (staleness_mean / _max over all
  steps, stale_token_frac), the log-prob mismatch mismatch_k3, and per-step wall time: the median
  time_step_s, time_rollout_s and time_update_s, and the share of steps after the first whose
  rollout + update spans exceed the step's (the overlap acting). The notebook reads `summarize`.
"""
import argparse
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dapo_jax.analysis import ablations, stats  # noqa: E402

METRIC = "avg@8"
_K_RE = re.compile(r"^staleness(?P<k>\d+)$")


def _median(run, key: str) -> float:
  v = run.series(key)[1]
  return float(np.median(v)) if v.size else float("nan")


def _mean(run, key: str) -> float:
  v = run.series(key)[1]
  return float(v.mean()) if v.size else float("nan")


def _overlap_share(run) -> float:
  """Share of steps after the first whose rollout + update spans exceed the step's wall time."""
  rows = [r for r in run.train[1:] if "time_step_s" in r]  # run.train is sorted by step
  if not rows:
    return float("nan")
  return float(np.mean([r["time_rollout_s"] + r["time_update_s"] > r["time_step_s"]
                        for r in rows]))


def _arm(runs) -> dict:
  """One k's per-run figures, averaged over its finished seeds."""
  def mean(f):
    v = [f(r) for r in runs]
    v = [x for x in v if x is not None and np.isfinite(x)]
    return float(np.mean(v)) if v else float("nan")
  return {"seeds": sorted(r.seed for r in runs),
          METRIC: mean(lambda r: r.final_eval(METRIC)),
          "staleness_mean": mean(lambda r: _mean(r, "staleness_mean")),
          "staleness_max": max((float(r.series("staleness_max")[1].max()) for r in runs
                                if r.series("staleness_max")[1].size), default=float("nan")),
          "stale_token_frac": mean(lambda r: _mean(r, "stale_token_frac")),
          "mismatch_k3": mean(lambda r: _mean(r, "mismatch_k3")),
          "time_step_s": mean(lambda r: _median(r, "time_step_s")),
          "time_rollout_s": mean(lambda r: _median(r, "time_rollout_s")),
          "time_update_s": mean(lambda r: _median(r, "time_update_s")),
          "overlap_share": mean(_overlap_share)}


def summarize(root: str) -> list[dict]:
  """Rows by k (finished runs only: those with results.json), each k >= 1 compared with k = 0
  on the seeds both finished; Holm over those comparisons."""
  by_k = {}
  for run in ablations.load_runs(root).values():
    m = _K_RE.match(run.group)
    if m is None:
      raise ValueError(f"{root}/{run.name}: not a staleness run (expected staleness<k>_s<seed>)")
    if run.results:
      by_k.setdefault(int(m.group("k")), []).append(run)
  if 0 not in by_k:
    raise ValueError(f"{root}: no finished k = 0 run to compare with")
  base = {r.seed: r.final_eval(METRIC) for r in by_k[0]}
  rows = []
  for k in sorted(by_k):
    row = {"k": k, **_arm(by_k[k])}
    if k:
      mine = {r.seed: r.final_eval(METRIC) for r in by_k[k]}
      t = stats.one_sample_t([mine[s] - base[s] for s in sorted(mine) if s in base])
      row.update(diff=t.diff, ci_half=t.half, p=t.p, paired_seeds=t.n)
    rows.append(row)
  # Holm's m counts distinct tests: arms whose per-seed results are bit-identical (k beyond the
  # staleness the sampler can reach) are one computation, and a nan p is no test at all.
  tests: dict[tuple, list[dict]] = {}
  for r in rows:
    if r["k"] and np.isfinite(r["p"]):
      key = tuple(sorted((run.seed, run.final_eval(METRIC)) for run in by_k[r["k"]]))
      tests.setdefault(key, []).append(r)
  distinct = list(tests.values())
  for same, p_adj in zip(distinct, stats.holm([same[0]["p"] for same in distinct])):
    for r in same:
      r.update(p_adj=p_adj, same_as=same[0]["k"] if r is not same[0] else None)
  for r in rows:
    if r["k"] and "p_adj" not in r:
      r.update(p_adj=float("nan"), same_as=None)
  return rows


def render(rows: list[dict]) -> str:
  head = ("| k | seeds | avg@8 after | vs k=0 (95 % CI) | p / p_adj | staleness mean / max | "
          "stale tokens | mismatch k3 | step / rollout / update s (median) | overlap |")
  lines = [head, "|" + "---|" * 10]
  for r in rows:
    paired = r["k"] and r["paired_seeds"] >= 2
    cmp = (f"{100 * r['diff']:+.1f} [{100 * (r['diff'] - r['ci_half']):+.1f}, "
           f"{100 * (r['diff'] + r['ci_half']):+.1f}] pts" if paired else
           f"{100 * r['diff']:+.1f} pts (1 seed)" if r["k"] else "—")
    p = (f"{r['p']:.2f} / {r['p_adj']:.2f}" if paired and np.isfinite(r["p"]) else "—")
    if r["k"] and r.get("same_as") is not None:
      p += f" (= k {r['same_as']})"
    lines.append(
        f"| {r['k']} | {len(r['seeds'])} | {100 * r[METRIC]:.1f} % | {cmp} | {p} | "
        f"{r['staleness_mean']:.2f} / {r['staleness_max']:.0f} | {100 * r['stale_token_frac']:.0f} % | "
        f"{r['mismatch_k3']:.1e} | {r['time_step_s']:.0f} / {r['time_rollout_s']:.0f} / "
        f"{r['time_update_s']:.0f} | {100 * r['overlap_share']:.0f} % |")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--root", default="experiments/results/async")
  p.add_argument("--json", default=None, help="also write the rows here")
  args = p.parse_args(argv)
  rows = summarize(args.root)
  print(render(rows))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
