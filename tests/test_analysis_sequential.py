"""The group-sequential design against published constants and hand-worked cases: one look is the
fixed-sample test, O'Brien–Fleming's constants for 3 and 5 equally spaced looks (Jennison &
Turnbull 2000, Table 2.3: C_B(3, 0.05) = 2.004, C_B(5, 0.05) = 2.040), a Monte-Carlo check of the
crossing probability under drift, and Holm's step-down at a look."""
import math

import numpy as np
import pytest
from scipy import stats as sps

from dapo_jax.analysis import sequential as seq


def test_one_look_is_the_fixed_sample_test():
  assert seq.obf_bounds(0.05, [1.0]) == pytest.approx([1.959964], abs=1e-5)
  assert seq.nominal_levels(0.01, [1.0]) == pytest.approx([0.01], abs=1e-8)


def test_obrien_fleming_constants():
  b3 = seq.obf_bounds(0.05, [1 / 3, 2 / 3, 1.0])
  assert b3 == pytest.approx([2.004 * math.sqrt(3), 2.004 * math.sqrt(1.5), 2.004], abs=2e-3)
  assert seq.obf_bounds(0.05, [0.2, 0.4, 0.6, 0.8, 1.0])[-1] == pytest.approx(2.040, abs=1e-3)
  assert seq.crossing_prob(b3, [1 / 3, 2 / 3, 1.0]) == pytest.approx(0.05, abs=1e-8)
  levels = seq.nominal_levels(0.05 / 4, [1 / 3, 2 / 3, 1.0])
  assert levels[0] < levels[1] < levels[2] < 0.0125  # spends almost nothing early
  with pytest.raises(ValueError, match="information fractions"):
    seq.obf_bounds(0.05, [0.5, 0.9])


def test_crossing_probability_by_monte_carlo():
  # 200,000 Brownian paths with drift 2.5 observed at t = 1/3, 2/3, 1
  rng = np.random.default_rng(0)
  t = np.array([1 / 3, 2 / 3, 1.0])
  steps = rng.normal(2.5 * np.diff(t, prepend=0.0), np.sqrt(np.diff(t, prepend=0.0)),
                     size=(200_000, 3))
  z = np.cumsum(steps, axis=1) / np.sqrt(t)
  b = np.array(seq.obf_bounds(0.05, t))
  crossed = np.mean((np.abs(z) >= b).any(axis=1))
  assert seq.crossing_prob(b, t, drift=2.5) == pytest.approx(crossed, abs=0.004)
  # power: the same design at 60 seeds and effect 2.5 / √60 sds
  assert seq.power(effect=2.5 / math.sqrt(60), looks=[20, 40, 60], alpha=0.05) == pytest.approx(
      seq.crossing_prob(b, t, drift=2.5))


def test_sequential_p_inverts_the_nominal_levels():
  t = [1 / 3, 2 / 3, 1.0]
  for a in (0.0125, 0.05):
    lv = seq.nominal_levels(a, t)
    for j in range(3):  # a p exactly at look j's level at a has sequential p a
      p = [None] * j + [lv[j]]
      assert seq.sequential_p(p, t) == pytest.approx(a, rel=1e-6)
      # just below it: rejects at a; just above: does not
      assert seq.sequential_p([None] * j + [lv[j] * 0.99], t) < a
      assert seq.sequential_p([None] * j + [lv[j] * 1.01], t) > a
  # the best look counts; a later, worse p does not undo an earlier crossing
  lv = seq.nominal_levels(0.05, t)
  assert seq.sequential_p([lv[0], 0.9, 0.9], t) == pytest.approx(0.05, rel=1e-6)
  assert seq.sequential_p([None, float("nan")], t) == 1.0
  with pytest.raises(ValueError, match="4 looks taken, the design has 3"):
    seq.sequential_p([0.1] * 4, t)


def test_holm_on_sequential_p_steps_down_and_recycles():
  from dapo_jax.analysis.stats import holm  # pylint: disable=g-import-not-at-top
  t = [1 / 3, 2 / 3, 1.0]
  lv = {m: seq.nominal_levels(0.05 / m, t) for m in (1, 2, 3)}
  # last look: smallest p under the 3-claim level, the next under the 2-claim level, the third
  # over the 1-claim level: two rejections
  q = [seq.sequential_p([None, None, p], t) for p in (lv[3][2] * 0.9, lv[2][2] * 0.9,
                                                       lv[1][2] * 1.1)]
  assert [p <= 0.05 for p in holm(q)] == [True, True, False]
  # recycled alpha reaches back: c crossed the 1-claim level at look 0, a and b reject at
  # look 2, so c rejects too at look 2 (tested at the whole alpha at every look so far)
  q_c = seq.sequential_p([lv[1][0] * 0.9, 0.5, 0.5], t)
  assert q_c < 0.05 and [p <= 0.05 for p in holm(q[:2] + [q_c])] == [True, True, True]
  assert q_c > 0.05 / 3  # alone at its Bonferroni share it would not have


def test_repeated_ci():
  lo, hi = seq.repeated_ci(diff=1.0, sd=2.0, n=9, level_p=0.01)
  half = sps.t.isf(0.005, 8) * 2.0 / 3.0
  assert (lo, hi) == pytest.approx((1.0 - half, 1.0 + half))
  assert all(math.isnan(v) for v in seq.repeated_ci(diff=1.0, sd=1.0, n=1, level_p=0.05))
