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
    assert rows[k]["p_adj"] >= rows[k]["p"]
  assert rows[0]["staleness_max"] == 0 and rows[1]["staleness_max"] == 1
  assert "| 0 | 3 |" in summary.render(list(rows.values()))


def test_a_run_that_is_not_a_staleness_run_is_named(tmp_path):
  sys.path.insert(0, REPO)
  summary = importlib.import_module("experiments.async_summary")
  (tmp_path / "dapo_s0").mkdir()
  (tmp_path / "dapo_s0" / "metrics.jsonl").write_text("")
  with pytest.raises(ValueError, match="dapo_s0: not a staleness run"):
    summary.summarize(str(tmp_path))
