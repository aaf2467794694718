"""Confirmatory verdicts from a registration: looks taken only on complete seeds in registered
order, decisions by sequential p and Holm, bounds at the last look, refusals of bad files."""
import importlib
import json
import os
import sys

import numpy as np
import pytest
from scipy import stats

from dapo_jax.analysis import ablations, confirm, sequential

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _registration(tmp_path, **change):
  raw = {"campaign": "c", "registered": "2026-12-05", "family": "c", "runs": "c",
         "config": "configs/ladder.py", "base": "testbed", "steps": 30, "overrides": {},
         "arms": ["x", "y"], "seeds": list(range(100, 112)), "looks": [4, 8, 12],
         "alpha": 0.05, "boundary": "obrien_fleming", "multiplicity": "holm",
         "analysis_commit": "0" * 40, "stopping": "s", "failed_runs": "f", "exploratory": [],
         "claims": [
             {"id": "big", "claim": "y beats x", "a": "y", "b": "x", "metric": "avg@8",
              "expected": "higher", "planning": {"effects": {"pilot": 1.0}}},
             {"id": "none", "claim": "y's trend", "a": "y", "b": None, "metric": "acc:slope",
              "expected": "higher", "planning": {"effects": {"pilot": 0.5}}}]}
  raw.update(change)
  path = tmp_path / "reg.json"
  path.write_text(json.dumps(raw))
  return str(path)


def _runs(seeds, gain, rng):
  """x and y runs: y's held-out accuracy x's + gain + noise; y's train 'acc' trendless."""
  runs = {}
  for s in seeds:
    base = 0.5 + 0.05 * rng.standard_normal()
    for arm, acc in (("x", base), ("y", base + gain + 0.002 * rng.standard_normal())):
      train = [{"kind": "train", "step": t, "acc": float(rng.standard_normal())}
               for t in range(1, 11)]
      runs[f"{arm}_s{s}"] = ablations.RunLog(f"{arm}_s{s}", arm, s, train, [],
                                            {"after": {"avg@8": acc}}, {"seed": s})
  return runs


def test_decides_at_the_first_look_that_crosses_and_bounds_the_rest(tmp_path):
  reg = confirm.load_registration(_registration(tmp_path))
  runs = _runs(reg.seeds, 0.05, np.random.default_rng(0))
  recs = {r["id"]: r for r in confirm.decide(reg, runs)}
  big, none = recs["big"], recs["none"]
  assert big["verdict"] == "reproduced" and big["look"] == 1 and big["seed_list"] == [100, 101,
                                                                                       102, 103]
  # its raw p recomputed from the numbers with scipy, and its q inverts the O'Brien-Fleming level
  a = [runs[f"y_s{s}"].results["after"]["avg@8"] for s in big["seed_list"]]
  b = [runs[f"x_s{s}"].results["after"]["avg@8"] for s in big["seed_list"]]
  assert big["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
  assert big["q"] == pytest.approx(sequential.sequential_p([big["p"]], reg.fractions))
  assert none["verdict"] == "bounded" and none["look"] == 3 and none["seeds"] == 12
  assert none["p_by_look"] and len(none["p_by_look"]) == 3
  assert none["repeated_ci_low"] < 0 < none["repeated_ci_high"]
  assert none["repeated_ci_low"] < none["ci_low"]     # wider than the unadjusted interval
  assert all(r["phase"] == "confirmatory" and r["runs"] == "c" for r in recs.values())


def test_a_look_waits_for_every_arm_of_its_seeds_in_registered_order(tmp_path):
  reg = confirm.load_registration(_registration(tmp_path))
  runs = _runs(reg.seeds, 0.0, np.random.default_rng(1))
  del runs["x_s103"]                   # seed 103 unfinished: only seeds 100-102 are complete
  recs = confirm.decide(reg, runs)
  assert all(r["looks_taken"] == [] and r["verdict"] == "undecided" for r in recs)
  runs["x_s103"] = ablations.RunLog("x_s103", "x", 103, [], [], {})  # running: no "after"
  assert confirm.finished_seeds(reg, runs) == [100, 101, 102]
  # an unregistered seed never counts
  runs.update(_runs([7], 0.0, np.random.default_rng(2)))
  assert 7 not in confirm.finished_seeds(reg, runs)


def test_refuted_when_it_crosses_with_the_other_sign(tmp_path):
  reg = confirm.load_registration(_registration(tmp_path))
  recs = confirm.decide(reg, _runs(reg.seeds, -0.05, np.random.default_rng(3)))
  assert recs[0]["verdict"] == "refuted" and recs[0]["p_adj"] <= 0.05


def test_a_run_whose_config_has_another_seed_is_an_error(tmp_path):
  reg = confirm.load_registration(_registration(tmp_path))
  runs = _runs(reg.seeds, 0.0, np.random.default_rng(4))
  runs["y_s101"].config["seed"] = 1
  with pytest.raises(ValueError, match="y_s101: config.json has seed 1"):
    confirm.decide(reg, runs)


@pytest.mark.parametrize("change,match", [
    ({"looks": [4, 8]}, "looks must rise"),
    ({"seeds": [1, 1] + list(range(10))}, "seeds must be distinct"),
    ({"boundary": "pocock"}, "only boundary obrien_fleming"),
    ({"extra": 1}, "extra"),
    ({"claims": [{"id": "z", "claim": "", "a": "w", "b": None, "metric": "m",
                  "expected": "higher", "planning": {}}]}, "not among"),
])
def test_bad_registrations_name_the_file(tmp_path, change, match):
  with pytest.raises(ValueError, match=match):
    confirm.load_registration(_registration(tmp_path, **change))


def test_confirm_script_writes_its_family_and_keeps_the_others(tmp_path, capsys):
  sys.path.insert(0, REPO)
  script = importlib.import_module("experiments.confirm")
  reg_path = _registration(tmp_path)
  reg = confirm.load_registration(reg_path)
  for name, run in _runs(reg.seeds[:4], 0.05, np.random.default_rng(5)).items():
    d = tmp_path / "results" / "c" / name
    d.mkdir(parents=True)
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in run.train))
    (d / "results.json").write_text(json.dumps(run.results))
    (d / "config.json").write_text(json.dumps(run.config))
  verdicts = tmp_path / "verdicts.json"
  verdicts.write_text(json.dumps([{"claim": "old", "family": "ladder", "p_adj": 1.0,
                                   "phase": "exploratory"}]))
  script.main([f"--registration={reg_path}", f"--results={tmp_path / 'results'}",
                f"--verdicts={verdicts}"])
  out = capsys.readouterr().out
  assert "8 of 24 registered runs finished" in out and "-> reproduced" in out
  rows = json.loads(verdicts.read_text())
  assert [r["family"] for r in rows] == ["c", "c", "ladder"]
  script.main([f"--registration={reg_path}", f"--results={tmp_path / 'results'}",
                f"--verdicts={verdicts}"])  # re-running replaces, never appends
  assert len(json.loads(verdicts.read_text())) == 3
  script.main([f"--registration={reg_path}", "--plan"])
  assert "big: effect 1.000 sd (pilot): power" in capsys.readouterr().out


def test_endpoint_names_an_unknown_summary():
  run = ablations.RunLog("x_s0", "x", 0, [{"kind": "train", "step": 1, "acc": 1.0}], [],
                        {"after": {"avg@8": 0.25}})
  assert ablations.endpoint(run, "avg@8") == 0.25 and ablations.endpoint(run, "acc:tail") == 1.0
  assert ablations.endpoint(run, "nope") is None
  with pytest.raises(ValueError, match="endpoint 'acc:median': unknown summary 'median'"):
    ablations.endpoint(run, "acc:median")
