import json
import os

import numpy as np
import pytest

from dapo_jax.analysis import ablations


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
  runs = ablations.load_runs(str(tmp_path))
  g = ablations.by_group(runs)
  assert sorted(g) == ["dapo", "naive_grpo"] and len(g["dapo"]) == 3
  m, h, n = ablations.mean_ci([r.final_eval("avg@4") for r in g["dapo"]])
  # t(0.975, df=2) = 4.303 in printed tables (to 3 decimals, hence the tolerance)
  assert (m, n) == (pytest.approx(0.6), 3) and h == pytest.approx(4.303 * 0.1 / np.sqrt(3), rel=1e-4)
  run = g["dapo"][0]
  assert ablations.tail_mean(run, "gen_accuracy", frac=0.34) == pytest.approx(0.3)
  assert ablations.run_mean(run, "gen_accuracy") == pytest.approx(0.2)
  assert ablations.slope(run, "gen_accuracy") == pytest.approx(0.1)  # 0.1 per step, exactly
  assert ablations.largest_drop(run, "entropy") == pytest.approx(0.1)  # falls 0.1 a step
  assert ablations.largest_drop(run, "gen_accuracy") == pytest.approx(-0.1)  # only rises
  t = ablations.paired_test({r.seed: r.final_eval("avg@4") for r in g["dapo"]},
                           {r.seed: r.final_eval("avg@4") for r in g["naive_grpo"]})
  assert t.paired and t.diff == pytest.approx(0.35) and t.reading == "higher"


def test_bad_log_line_names_the_file(tmp_path):
  d = tmp_path / "x_s0"
  d.mkdir()
  (d / "metrics.jsonl").write_text('{"step": 1, "kind": "train"}\nnot json\n')
  with pytest.raises(ValueError, match=r"x_s0/metrics.jsonl:2"):
    ablations.load_runs(str(tmp_path))
  with pytest.raises(FileNotFoundError):
    ablations.load_runs(str(tmp_path / "missing"))


def test_endpoints_from_series(tmp_path):
  _write_run(tmp_path, "a_s0", [0.5, 0.2, 0.4, 0.1], 0.5)  # entropy 0.5, 0.8, 0.6, 0.9
  run = ablations.load_runs(str(tmp_path))["a_s0"]
  assert ablations.largest_drop(run, "entropy") == pytest.approx(0.2)  # 0.8 -> 0.6
  # slope by hand: steps 1..4 (mean 2.5), values mean 0.3; sum dx*dy = -0.3 + 0.05 + 0.05 - 0.3 = -0.5,
  # sum dx^2 = 5
  assert ablations.slope(run, "gen_accuracy") == pytest.approx(-0.1)
  assert ablations.slope(run, "missing") is None and ablations.largest_drop(run, "missing") is None


def test_budget_mean_reads_a_run_at_a_token_budget(tmp_path):
  d = tmp_path / "x_s0"
  d.mkdir()
  recs = [{"step": i, "kind": "train", "gen_tokens": 100.0, "gen_accuracy": 0.1 * i}
          for i in range(1, 7)]
  (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  run = ablations.load_runs(str(tmp_path))["x_s0"]
  # 350 tokens: steps 1-3 fit (300 tokens): (0.1 + 0.2 + 0.3) / 3
  assert ablations.budget_mean(run, "gen_accuracy", tokens=350) == pytest.approx(0.2)
  assert ablations.budget_mean(run, "gen_accuracy", tokens=600) == pytest.approx(0.35)
  assert ablations.budget_mean(run, "gen_accuracy", tokens=50) is None


def test_paired_test_uses_seed_pairs():
  a = {0: 0.50, 1: 0.61, 2: 0.72}
  b = {0: 0.45, 1: 0.55, 2: 0.68}  # every seed lower by ~0.05: paired sees it, Welch does not
  t = ablations.paired_test(a, b)
  assert t.paired and t.diff == pytest.approx(0.05) and t.reading == "higher"
  w = ablations.welch_t(list(a.values()), list(b.values()))
  assert not w.paired and w.reading == "overlapping"
  assert not ablations.paired_test({0: 1.0, 1: 2.0}, {0: 1.0, 2: 2.0}).paired  # seeds differ
  one = ablations.paired_test({0: 1.0, 1: 3.0}, None)  # one-sample: mean 2 against 0
  assert one.diff == pytest.approx(2.0) and one.n == 2


def test_claim_records_holm_and_verdicts_file(tmp_path):
  a = {0: 0.50, 1: 0.60, 2: 0.55}
  b = {0: 0.40, 1: 0.52, 2: 0.44}  # differences 0.10, 0.08, 0.11: mean 0.0967, sd 0.01528
  rec = ablations.claim_record("c", "avg@8", "x", "y", a, b, "higher", family="f")
  half = 4.303 * 0.0152753 / 3 ** 0.5  # t(0.975, df=2) * sd / sqrt(n), by hand
  assert rec["diff"] == pytest.approx(0.0966667, abs=1e-6)
  assert rec["ci_low"] == pytest.approx(0.0966667 - half, abs=1e-4)
  assert rec["ci_high"] == pytest.approx(0.0966667 + half, abs=1e-4)
  t = 0.0966667 / (0.0152753 / 3 ** 0.5)  # df = 2: P(|T| > t) = 1 - t / sqrt(t^2 + 2)
  assert rec["p"] == pytest.approx(1 - t / (t * t + 2) ** 0.5, rel=1e-4)
  other = ablations.claim_record("d", "m", "x", "y", a, b, "lower", family="f")
  one = ablations.claim_record("e", "m", "x", "y", {0: 1.0}, {0: 0.0}, "higher", family="g")
  with pytest.raises(ValueError, match="not adjusted"):
    ablations.write_verdicts([rec], str(tmp_path / "v.json"))
  rows = ablations.adjust_family([rec, other, one])
  # family f has two tests with the same p: Holm multiplies the smaller by 2, the next by 1,
  # then takes the running maximum, so both get 2p
  assert [r["p_adj"] for r in rows[:2]] == [pytest.approx(2 * rec["p"])] * 2
  assert [r["verdict"] for r in rows] == ["reproduced", "refuted", "inconclusive"]
  assert rows[0]["alpha_plan"] == 0.025 and rows[2]["alpha_plan"] == 0.05
  # a huge standardized effect (6.3 sds) needs the minimum, 2 pairs... checked against power_t
  n = rows[0]["seeds_needed_80"]
  assert ablations.power_t(effect=0.0966667 / 0.0152753, n=n, alpha=0.025) >= 0.8
  assert n == 2 or ablations.power_t(effect=0.0966667 / 0.0152753, n=n - 1, alpha=0.025) < 0.8
  path = tmp_path / "v.json"
  ablations.write_verdicts(rows, str(path))
  back = json.loads(path.read_text())
  assert back[2]["ci_low"] is None and back[2]["p_adj"] is None  # one seed: no test
  assert {"family", "p", "p_adj", "seeds", "seeds_needed_80", "verdict"} <= set(back[0])
  with pytest.raises(ValueError, match="expected"):
    ablations.claim_record("c", "m", "x", "y", a, b, "bigger", family="f")
