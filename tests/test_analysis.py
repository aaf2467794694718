import json
import os

import numpy as np
import pytest

from dapo_jax import analysis


def _write_run(root, name, accs, after, before=0.2):
  d = os.path.join(root, name)
  os.makedirs(d)
  with open(os.path.join(d, "metrics.jsonl"), "w", encoding="utf-8") as f:
    f.write(json.dumps({"step": 0, "kind": "eval", "tag": "before", "avg@4": before}) + "\n")
    for i, a in enumerate(accs, 1):
      f.write(json.dumps({"step": i, "kind": "train", "gen_accuracy": a, "entropy": 1.0 - a}) + "\n")
  with open(os.path.join(d, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"before": {"avg@4": before}, "after": {"avg@4": after}, "steps": len(accs)}, f)


def test_load_group_and_stats(tmp_path):
  for s, after in enumerate([0.5, 0.6, 0.7]):
    _write_run(tmp_path, f"dapo_s{s}", [0.1, 0.2, 0.3], after)
  for s, after in enumerate([0.2, 0.25, 0.3]):
    _write_run(tmp_path, f"naive_grpo_s{s}", [0.1, 0.1, 0.1], after)
  runs = analysis.load_runs(str(tmp_path))
  g = analysis.by_group(runs)
  assert sorted(g) == ["dapo", "naive_grpo"] and len(g["dapo"]) == 3
  m, h, n = analysis.mean_ci([r.final_eval("avg@4") for r in g["dapo"]])
  assert (m, n) == (pytest.approx(0.6), 3) and h == pytest.approx(4.303 * 0.1 / np.sqrt(3))
  assert analysis.tail_mean(g["dapo"][0], "gen_accuracy", frac=0.34) == pytest.approx(0.3)
  d, half, word = analysis.compare([r.final_eval("avg@4") for r in g["dapo"]],
                                   [r.final_eval("avg@4") for r in g["naive_grpo"]])
  assert d == pytest.approx(0.35) and word == "higher"
  assert analysis.verdict(word, "higher") == "reproduced"
  assert analysis.verdict(word, "lower") == "refuted"
  assert analysis.verdict("overlapping", "higher") == "inconclusive"
  assert analysis.compare([1.0], [0.0])[2] == "insufficient"


def test_bad_log_line_names_the_file(tmp_path):
  d = tmp_path / "x_s0"
  d.mkdir()
  (d / "metrics.jsonl").write_text('{"step": 1, "kind": "train"}\nnot json\n')
  with pytest.raises(ValueError, match=r"x_s0/metrics.jsonl:2"):
    analysis.load_runs(str(tmp_path))
  with pytest.raises(FileNotFoundError):
    analysis.load_runs(str(tmp_path / "missing"))


def test_paired_comparison_uses_seed_pairs():
  a = {0: 0.50, 1: 0.61, 2: 0.72}
  b = {0: 0.45, 1: 0.55, 2: 0.68}  # every seed lower by ~0.05: paired sees it, Welch does not
  d, half, word = analysis.compare_paired(a, b)
  assert d == pytest.approx(0.05) and word == "higher"
  assert analysis.compare(list(a.values()), list(b.values()))[2] == "overlapping"
  assert analysis.compare_paired({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0})[2] == "overlapping"


def test_claim_record_and_verdicts_file(tmp_path):
  a = {0: 0.50, 1: 0.60, 2: 0.55}
  b = {0: 0.40, 1: 0.52, 2: 0.44}  # differences 0.10, 0.08, 0.11: mean 0.0967, sd 0.01528
  rec = analysis.claim_record("c", "avg@8", "x", "y", a, b, "higher")
  half = 4.303 * 0.0152753 / 3 ** 0.5  # t(0.975, df=2) * sd / sqrt(n), by hand
  assert rec["diff"] == pytest.approx(0.0966667, abs=1e-6)
  assert rec["ci_low"] == pytest.approx(0.0966667 - half, abs=1e-5)
  assert rec["ci_high"] == pytest.approx(0.0966667 + half, abs=1e-5)
  assert (rec["seeds"], rec["verdict"]) == (3, "reproduced")
  assert analysis.claim_record("c", "m", "x", "y", a, b, "lower")["verdict"] == "refuted"
  one = analysis.claim_record("c", "m", "x", "y", {0: 1.0}, {0: 0.0}, "higher")
  assert one["verdict"] == "inconclusive"
  path = tmp_path / "v.json"
  analysis.write_verdicts([rec, one], str(path))
  rows = json.loads(path.read_text())
  assert [r["verdict"] for r in rows] == ["reproduced", "inconclusive"]
  assert rows[1]["ci_low"] is None  # NaN interval with one seed is written as null
  assert set(rows[0]) == {"claim", "metric", "a", "b", "diff", "ci_low", "ci_high", "seeds",
                          "verdict"}
