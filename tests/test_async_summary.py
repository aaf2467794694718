"""experiments/async_summary.py on the committed colocated staleness sweep: the paired
differences recomputed from each run's results.json, Holm over the k >= 1 comparisons."""
import importlib
import json
import os
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.join(REPO, "experiments/results/async_colocated")


def _after(name):
  with open(os.path.join(ROOT, name, "results.json"), encoding="utf-8") as f:
    return json.load(f)["after"]["avg@8"]


def test_rows_recompute_from_the_results_files():
  sys.path.insert(0, REPO)
  summary = importlib.import_module("experiments.async_summary")
  rows = {r["k"]: r for r in summary.summarize(ROOT)}
  assert sorted(rows) == [0, 1, 2, 4] and all(r["seeds"] == [0, 1, 2] for r in rows.values())
  for k in (1, 2, 4):
    diffs = [_after(f"staleness{k}_s{s}") - _after(f"staleness0_s{s}") for s in range(3)]
    assert rows[k]["diff"] == pytest.approx(np.mean(diffs), abs=1e-12)
  # k = 2 and 4 are bit-identical to k = 1 (the sampler never runs 2 versions ahead): one
  # computation, so one test, and Holm's m is 1 — the adjusted p is the raw p.
  assert rows[2]["same_as"] == rows[4]["same_as"] == 1 and rows[1]["same_as"] is None
  assert rows[1]["p_adj"] == rows[2]["p_adj"] == rows[4]["p_adj"] == rows[1]["p"]
  assert rows[0]["staleness_max"] == 0 and rows[1]["staleness_max"] == 1
  assert "| 0 | 3 |" in summary.render(list(rows.values()))


def test_a_nan_comparison_is_not_counted_and_distinct_arms_are(tmp_path):
  sys.path.insert(0, REPO)
  summary = importlib.import_module("experiments.async_summary")
  def run(k, seed, acc):
    d = tmp_path / f"staleness{k}_s{seed}"
    d.mkdir()
    (d / "metrics.jsonl").write_text(json.dumps({"kind": "train", "step": 1}) + "\n")
    (d / "results.json").write_text(json.dumps({"after": {"avg@8": acc}}))
  for s, (a0, a1, a2) in enumerate([(0.5, 0.6, 0.4), (0.4, 0.55, 0.45), (0.6, 0.62, 0.5)]):
    run(0, s, a0); run(1, s, a1); run(2, s, a2)
  run(4, 0, 0.7)  # one seed: no p, not a test
  rows = {r["k"]: r for r in summary.summarize(str(tmp_path))}
  assert np.isnan(rows[4]["p"]) and np.isnan(rows[4]["p_adj"])
  lo, hi = sorted((rows[1]["p"], rows[2]["p"]))
  assert sorted((rows[1]["p_adj"], rows[2]["p_adj"])) == pytest.approx([2 * lo, max(2 * lo, hi)])


def test_a_run_that_is_not_a_staleness_run_is_named(tmp_path):
  sys.path.insert(0, REPO)
  summary = importlib.import_module("experiments.async_summary")
  (tmp_path / "dapo_s0").mkdir()
  (tmp_path / "dapo_s0" / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match="dapo_s0: not a staleness run"):
    summary.summarize(str(tmp_path))
