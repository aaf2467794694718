"""CI executes the ablation notebook on the committed sweep logs: no cell may error, every
verdict line must be one of the three verdicts, and each record of verdicts.json — its
difference, raw p, Holm-adjusted p within its family and verdict — must be what the committed
logs say, recomputed here from the raw files (not through dapo_jax.analysis.ablations). The confirmatory
records: the registered seeds in order, each look's raw p from the files; the committed
verdicts.json must be what the notebook writes."""
import json
import math
import os
import re

import nbformat
import numpy as np
import pytest
from scipy import stats
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "notebooks", "ablations.ipynb")
RESULTS = os.path.join(REPO, "experiments", "results")
VERDICT_LINE = re.compile(r"^    (\S+) − (\S+) on (\S+): .* -> (\S+)$")


def _execute(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  env = dict(DAPO_RESULTS=RESULTS, PYTHONPATH=REPO,
             DAPO_VERDICTS=str(tmp_path / "verdicts.json"))
  client = NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  old = dict(os.environ)
  os.environ.update(env)
  try:
    client.execute()
  finally:
    os.environ.clear()
    os.environ.update(old)
  return nb


def _train(run_dir, key):
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    recs = sorted((json.loads(ln) for ln in f), key=lambda r: r["step"])
  recs = [r for r in recs if r["kind"] == "train" and isinstance(r.get(key), float)]
  return np.array([r["step"] for r in recs], float), np.array([r[key] for r in recs])


def _raw_value(sweep, run, metric):
  """A run's number for a claim straight from the files, per the notebook's endpoint names."""
  run_dir = os.path.join(RESULTS, sweep, run)
  key, _, endpoint = metric.partition(":")
  if not endpoint:  # the held-out eval after training
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
      return float(json.load(f)["after"][key])
  steps, v = _train(run_dir, key)
  if endpoint == "tail":  # the last third (34 %, rounded) of the logged steps
    return float(np.mean(v[-max(1, int(round(0.34 * len(v)))):]))
  if endpoint == "run_mean":
    return float(np.mean(v))
  if endpoint == "slope":  # least squares by the normal equations
    x = steps - steps.mean()
    return float(np.sum(x * (v - v.mean())) / np.sum(x * x))
  if endpoint == "largest_drop":
    return float(max(v[i - 1] - v[i] for i in range(1, len(v))))
  if endpoint == "budget_mean":  # dapo's steps within the same seed's token_level total
    seed = run.rsplit("_s", 1)[1]
    budget = _train(os.path.join(RESULTS, sweep, f"token_level_s{seed}"), "gen_tokens")[1].sum()
    n = int(np.sum(np.cumsum(_train(run_dir, "gen_tokens")[1]) <= budget))
    return float(np.mean(v[:n]))
  raise AssertionError(f"unknown endpoint {endpoint!r}")


def _pilot_value(run, metric):
  """A pilot16 run's whole-run value of a mechanism's measure, from the raw files."""
  if metric == "length_p90_over_mean:run_mean":  # p90 over mean response length, per step
    run_dir = os.path.join(RESULTS, "pilot16", run)
    p90, mean = _train(run_dir, "response_length_p90")[1], _train(run_dir, "response_length_mean")[1]
    return float(np.mean(p90 / mean))
  return _raw_value("pilot16", run, metric)


def _finished_seeds(root, arm):
  """Seeds of `arm` in `root` whose run finished (results.json with an after-eval)."""
  out = set()
  for name in os.listdir(root):
    path = os.path.join(root, name, "results.json")
    if name.rsplit("_s", 1)[0] == arm and os.path.isfile(path):
      with open(path, encoding="utf-8") as f:
        if "after" in json.load(f):
          out.add(int(name.rsplit("_s", 1)[1]))
  return out


def _oracle(rec):
  """(mean difference, raw p) of a record, from the raw files and scipy's own t tests."""
  sweep = rec["family"].removesuffix("_secondary")  # a family is named after its directory
  root = os.path.join(RESULTS, sweep)  # the seeds both arms finished
  seeds = sorted(_finished_seeds(root, rec["a"]) & (
      _finished_seeds(root, rec["b"]) if rec["b"] else _finished_seeds(root, rec["a"])))
  a = np.array([_raw_value(sweep, f"{rec['a']}_s{s}", rec["metric"]) for s in seeds])
  if rec["b"] is None:
    return a.mean(), stats.ttest_1samp(a, 0.0).pvalue
  b_metric = "gen_accuracy:run_mean" if rec["metric"].endswith("budget_mean") else rec["metric"]
  b = np.array([_raw_value(sweep, f"{rec['b']}_s{s}", b_metric) for s in seeds])
  return (a - b).mean(), stats.ttest_rel(a, b).pvalue


def _holm(p):
  """Holm's step-down procedure written out: the k-th smallest p (k = 1..m) times m - k + 1,
  each at least the one before it, at most 1."""
  order = sorted(range(len(p)), key=lambda i: p[i])
  out, running = [0.0] * len(p), 0.0
  for k, i in enumerate(order):
    running = max(running, min(1.0, (len(p) - k) * p[i]))
    out[i] = running
  return out


def _power(effect, n, alpha):
  """P(|T| > t_crit) of the two-sided paired t test, T ~ noncentral t(n - 1, effect * sqrt(n))."""
  crit = stats.t.isf(alpha / 2, n - 1)
  dist = stats.nct(n - 1, effect * math.sqrt(n))
  return dist.sf(crit) + dist.cdf(-crit)


def _check_confirmatory(records):
  """Each registration's records: its seeds in registered order up to the first incomplete one,
  looks only at registered sizes, each reported raw p recomputed from the files."""
  regs = {}
  for name in os.listdir(os.path.join(REPO, "experiments", "preregistration")):
    if name.endswith(".json"):
      with open(os.path.join(REPO, "experiments", "preregistration", name), encoding="utf-8") as f:
        reg = json.load(f)
      regs[reg["family"]] = reg
  assert sorted({r["family"] for r in records}) == sorted(regs)
  for family, reg in regs.items():
    mine = [r for r in records if r["family"] == family]
    assert [r["id"] for r in mine] == [c["id"] for c in reg["claims"]]
    root = os.path.join(RESULTS, reg["runs"])
    done = ({arm: _finished_seeds(root, arm) for arm in reg["arms"]} if os.path.isdir(root)
            else {arm: set() for arm in reg["arms"]})
    complete = []
    for seed in reg["seeds"]:
      if not all(seed in done[arm] for arm in reg["arms"]):
        break
      complete.append(seed)
    taken = [n for n in reg["looks"] if n <= len(complete)]
    for r in mine:
      assert set(r["looks_taken"]) <= set(taken) and r["verdict"] in (
          "reproduced", "refuted", "bounded", "undecided")
      if not r["looks_taken"]:
        assert r["verdict"] == "undecided" and r["seeds"] == 0
        continue
      seeds = complete[:reg["looks"][r["look"] - 1]]
      assert r["seed_list"] == seeds
      a = np.array([_raw_value(reg["runs"], f"{r['a']}_s{s}", r["metric"]) for s in seeds])
      if r["b"] is None:
        p = stats.ttest_1samp(a, 0.0).pvalue
      else:
        b = np.array([_raw_value(reg["runs"], f"{r['b']}_s{s}", r["metric"]) for s in seeds])
        p = stats.ttest_rel(a, b).pvalue
      assert r["p"] == pytest.approx(p, rel=1e-6), r["id"]
      assert (r["verdict"] in ("reproduced", "refuted")) == (r["p_adj"] <= reg["alpha"])


@pytest.mark.skipif(not os.path.isdir(os.path.join(RESULTS, "ladder")),
                    reason="no committed ladder logs")
def test_ablations_notebook_verdicts_match_the_logs(tmp_path):
  nb = _execute(tmp_path)
  text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
  assert "ladder runs" in text
  lines = [m.groups() for m in map(VERDICT_LINE.match, text.splitlines()) if m]
  written = json.loads((tmp_path / "verdicts.json").read_text())
  assert {r["phase"] for r in written} <= {"confirmatory", "exploratory"}
  with open(os.path.join(RESULTS, "verdicts.json"), encoding="utf-8") as f:
    committed = json.load(f)
  assert [(r["family"], r["claim"], r["verdict"]) for r in committed] == [
      (r["family"], r["claim"], r["verdict"]) for r in written], "verdicts.json is stale"
  for r, c in zip(written, committed):
    assert c["p_adj"] == (None if r["p_adj"] is None else pytest.approx(r["p_adj"], rel=1e-9))
  _check_confirmatory([r for r in written if r["phase"] == "confirmatory"])
  rows = [r for r in written if r["phase"] == "exploratory"]
  assert [(r["a"], r["b"] or "0", r["metric"], r["verdict"]) for r in rows] == lines
  assert sum(r["family"] == "ladder" for r in rows) == 9, "the nine ladder claims"
  for family in {r["family"] for r in rows}:
    members = [r for r in rows if r["family"] == family]
    want_adj = _holm([_oracle(r)[1] for r in members])
    for r, p_adj in zip(members, want_adj):
      diff, p = _oracle(r)
      assert r["diff"] == pytest.approx(diff, abs=1e-9), r["claim"]
      assert r["p"] == pytest.approx(p, rel=1e-6), r["claim"]
      assert r["p_adj"] == pytest.approx(p_adj, rel=1e-6), r["claim"]
      sign = 1 if r["expected"] == "higher" else -1
      want = ("inconclusive" if p_adj >= 0.05 else
              "reproduced" if sign * diff > 0 else "refuted")
      assert r["verdict"] == want, r["claim"]
      n = r["seeds_needed_80"]  # the smallest n with 80 % power at alpha / m (noncentral t)
      effect = diff / r["sd_diff"]
      assert _power(effect, n, 0.05 / len(members)) >= 0.8, r["claim"]
      assert n == 2 or _power(effect, n - 1, 0.05 / len(members)) < 0.8, r["claim"]
  pilot_seeds = sorted(_finished_seeds(os.path.join(RESULTS, "pilot16"), "lr1e-04"))
  for r in rows:  # each undecided ladder claim: its mechanism in the campaign setting's pilot
    if r["family"] != "ladder" or r["verdict"] != "inconclusive":
      continue
    mech = r["mechanism"]
    assert (mech["pilot"], mech["pilot_seeds"]) == ("pilot16/lr1e-04", len(pilot_seeds))
    for m in mech["measures"]:
      want = [_pilot_value(f"lr1e-04_s{s}", m["metric"]) for s in pilot_seeds]
      assert m["pilot"] == pytest.approx(want, rel=1e-9), (r["claim"], m["metric"])
      if m["floor"] is not None:
        assert m["reached"] == all(v >= m["floor"] for v in want), (r["claim"], m["metric"])
    reached = all(m["reached"] for m in mech["measures"] if m["floor"] is not None)
    if r["a"] == "clip_higher" and reached:  # binding at 0.28 without a 0.20 arm: not shown
      assert mech["acts"] is None and "eps_high 0.20" in mech["needs"]
    else:
      assert mech["acts"] == reached
  figures = sum(o.get("output_type") == "display_data" for c in nb.cells
                for o in c.get("outputs", []))
  assert figures >= 7, f"expected the ladder, Fig. 2-5, Fig. 7, trajectory and sweep figures, got {figures}"
