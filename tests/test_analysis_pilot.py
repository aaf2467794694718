"""The ε_high pilot grid read (dapo_jax.analysis.pilot): arms paired by seed, tail entropy, its
paired d, the upper-clip share, and which settings reach the registration threshold."""
import math

import pytest

from dapo_jax.analysis import ablations, pilot


def _run(setting, eps, seed, entropy, upclip, acc=0.5, finished=True):
  train = [{"step": i + 1, "entropy": v, "clipfrac_upper": upclip} for i, v in enumerate(entropy)]
  group = f"{setting}_eps{eps:.2f}"
  return ablations.RunLog(f"{group}_s{seed}", group, seed, train, [],
                          {"after": {"avg@8": acc}} if finished else {})


def _runs(*items):
  return {r.name: r for r in items}


def test_paired_tail_entropy_difference_and_d():
  # tail = the last third (1 of 3 steps): 0.20 arm tails 0.30 / 0.32 / 0.31, 0.28 arm +0.10 /
  # +0.12 / +0.08 above them: diffs 0.10, 0.12, 0.08 -> mean 0.10, sd 0.02, d 5
  lo = [0.30, 0.32, 0.31]
  hi = [0.40, 0.44, 0.39]
  runs = _runs(*[_run("mb16", 0.20, s, [0.5, 0.4, lo[s]], 0.001) for s in range(3)],
               *[_run("mb16", 0.28, s, [0.5, 0.45, hi[s]], 0.0002, acc=0.6) for s in range(3)])
  (row,) = pilot.table(runs)
  assert row["setting"] == "mb16" and row["seeds"] == [0, 1, 2]
  assert row["entropy_diff"] == pytest.approx(0.10)
  assert row["entropy_d"] == pytest.approx(5.0)
  assert row["acts"] and row["upclip_0.20"] == pytest.approx(0.001)
  assert row["avg@8_0.28"] == pytest.approx(0.6)
  assert "mb16" in pilot.render([row])


def test_unpaired_or_unfinished_runs_are_left_out_and_small_d_does_not_act():
  runs = _runs(_run("lr", 0.20, 0, [0.3, 0.3, 0.30], 0.0),
               _run("lr", 0.28, 0, [0.3, 0.3, 0.31], 0.0),
               _run("lr", 0.20, 1, [0.3, 0.3, 0.30], 0.0),
               _run("lr", 0.28, 1, [0.3, 0.3, 0.29], 0.0),
               _run("lr", 0.28, 2, [0.3, 0.3, 0.5], 0.0),                    # no 0.20 partner
               _run("lr", 0.20, 3, [0.3, 0.3, 0.3], 0.0, finished=False),   # still running
               _run("lr", 0.28, 3, [0.3, 0.3, 0.9], 0.0))
  (row,) = pilot.table(runs)
  assert row["seeds"] == [0, 1]
  assert row["entropy_diff"] == pytest.approx(0.0) and abs(row["entropy_d"]) < 1.5
  assert not row["acts"]
  one = pilot.table(_runs(_run("x", 0.20, 0, [0.3], 0.0), _run("x", 0.28, 0, [0.4], 0.0)))[0]
  assert math.isnan(one["entropy_d"]) and not one["acts"]  # one seed: no spread, no d
