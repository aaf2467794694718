"""The verdicts' statistics against values worked out independently: closed forms of the t
distribution, a hand-computed Holm example, G*Power's published sample sizes, and a Monte-Carlo
estimate of the paired t test's power."""
import math

import numpy as np
import pytest

from dapo_jax.analysis import stats as st


def test_t_test_p_values_from_closed_forms():
  # df = 2: P(|T| > t) = 1 - t / sqrt(t^2 + 2); differences 1, 2, 6: mean 3, sd sqrt(7)
  t = 3 / (math.sqrt(7) / math.sqrt(3))
  r = st.one_sample_t([1.0, 2.0, 6.0])
  assert r.diff == 3 and r.sd == pytest.approx(math.sqrt(7)) and r.n == 3
  assert r.p == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10)
  # df = 1 (Cauchy): P(|T| > t) = 1 - 2 atan(t) / pi; values 1, 3: mean 2, se 1, t = 2
  assert st.one_sample_t([1.0, 3.0]).p == pytest.approx(1 - 2 * math.atan(2) / math.pi)
  assert st.one_sample_t([1.0, 3.0]).half == pytest.approx(12.706, rel=1e-4)  # t(.975, 1) * 1
  assert st.one_sample_t([0.5, 0.5]).p == 0.0 and st.one_sample_t([0.0, 0.0]).p == 1.0
  assert math.isnan(st.one_sample_t([1.0]).p) and st.one_sample_t([None, 2.0]).n == 1


def test_welch_by_hand():
  # a = 1, 2, 3 (var 1), b = 2, 4, 6, 8, 10 (var 10): se^2 = 1/3 + 2, Welch-Satterthwaite df
  # = (7/3)^2 / ((1/3)^2 / 2 + 2^2 / 4) = 4.9 (by hand); the t statistic -4 / sqrt(7/3)
  w = st.welch_t([1.0, 2.0, 3.0], [2.0, 4.0, 6.0, 8.0, 10.0])
  from scipy import stats as sps  # the p for that t and df from the distribution itself
  assert w.diff == -4.0
  assert w.p == pytest.approx(2 * sps.t.cdf(-4 / math.sqrt(7 / 3), 49 / 9 / (1 / 18 + 1)))


def test_holm_hand_example():
  # sorted: 0.005*4 = 0.02, 0.01*3 = 0.03, 0.03*2 = 0.06, 0.04*1 = 0.04 -> running max 0.06
  adj = st.holm([0.01, 0.04, 0.03, 0.005])
  assert adj == pytest.approx([0.03, 0.06, 0.06, 0.02])
  assert st.holm([0.041] + [0.5] * 8)[0] == pytest.approx(0.369)  # 0.041 among 9 claims
  assert st.holm([0.6, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
  out = st.holm([0.01, None, float("nan")])  # untested members still count in m = 3
  assert out[0] == pytest.approx(0.03) and math.isnan(out[1]) and math.isnan(out[2])
  assert st.holm([]) == []
  with pytest.raises(ValueError, match="holm"):
    st.holm([1.5])


def test_power_and_seeds_match_published_sample_sizes():
  # G*Power 3 (one sample / matched pairs t, two-tailed, alpha 0.05, power 0.8): d = 0.5 -> 34
  # (actual power 0.8078), d = 0.8 -> 15 (0.8213), d = 0.2 -> 199
  assert st.power_t(effect=0.5, n=34, alpha=0.05) == pytest.approx(0.8078, abs=1e-4)
  assert st.power_t(effect=0.8, n=15, alpha=0.05) == pytest.approx(0.8213, abs=1e-4)
  assert [st.seeds_needed(effect=e, alpha=0.05) for e in (0.5, 0.8, -0.2)] == [34, 15, 199]
  assert st.power_t(effect=0.0, n=7, alpha=0.05) == pytest.approx(0.05)  # no effect: alpha
  assert st.seeds_needed(effect=0.0, alpha=0.05) is None
  assert st.seeds_needed(effect=float("nan"), alpha=0.05) is None
  assert st.seeds_needed(effect=math.inf, alpha=0.05) == 2
  assert st.seeds_needed(effect=1e-4, alpha=0.05, max_n=1000) is None
  with pytest.raises(ValueError, match="power_t"):
    st.power_t(effect=1.0, n=1, alpha=0.05)


def test_power_by_monte_carlo():
  # 40,000 simulated paired experiments of n = 6 differences ~ N(1.2, 1) at alpha = 0.05 / 9:
  # the share that the t test rejects estimates the power (standard error < 0.0025)
  rng = np.random.default_rng(0)
  n, effect, alpha = 6, 1.2, 0.05 / 9
  x = rng.normal(effect, 1.0, size=(40_000, n))
  t = x.mean(1) / (x.std(1, ddof=1) / math.sqrt(n))
  from scipy import stats as sps
  rejected = np.mean(np.abs(t) > sps.t.ppf(1 - alpha / 2, n - 1))
  assert st.power_t(effect=effect, n=n, alpha=alpha) == pytest.approx(rejected, abs=0.01)


def test_power_finite_at_large_noncentrality():
  # the noncentral t's survival function returns nan far in its tail (scipy 1.17.1 at d = 3,
  # n = 5, alpha 0.05/4); the direct integral stays a probability, rising with d and n, and
  # agrees with a Monte-Carlo estimate where the power is far from 1
  for n in (3, 5, 12):
    ps = [st.power_t(effect=d, n=n, alpha=0.05 / 4) for d in np.linspace(0.0, 10.0, 41)]
    assert all(0.0 <= p <= 1.0 for p in ps) and all(b >= a - 1e-12 for a, b in zip(ps, ps[1:]))
  assert st.seeds_needed(effect=3.0, alpha=0.05 / 4) == 5
  assert st.power_t(effect=3.0, n=4, alpha=0.05 / 4) < 0.8 < st.power_t(effect=3.0, n=5, alpha=0.05 / 4)
  rng = np.random.default_rng(1)
  x = rng.normal(2.0, 1.0, size=(40_000, 4))
  t = x.mean(1) / (x.std(1, ddof=1) / 2.0)
  from scipy import stats as sps
  rejected = np.mean(np.abs(t) > sps.t.ppf(1 - 0.0125 / 2, 3))
  assert st.power_t(effect=2.0, n=4, alpha=0.0125) == pytest.approx(rejected, abs=0.01)
  assert math.isnan(st.power_t(effect=float("nan"), n=5, alpha=0.05))
  assert st.power_t(effect=-math.inf, n=5, alpha=0.05) == 1.0


def test_hedges_j():
  # J(n) = Γ(df/2) / (√(df/2) Γ((df−1)/2)), df = n − 1: J(5) = 0.7979 (Hedges 1981's table:
  # 0.7979 at df 4), tends to 1 - 3 / (4 df - 1)
  assert st.hedges_j(5) == pytest.approx(0.79788, abs=1e-5)
  assert st.hedges_j(200) == pytest.approx(1 - 3 / (4 * 199 - 1), abs=1e-5)
  with pytest.raises(ValueError, match="hedges_j"):
    st.hedges_j(2)


def test_verdict_rule():
  assert st.verdict(diff=0.1, p_adj=0.049, expected="higher") == "reproduced"
  assert st.verdict(diff=0.1, p_adj=0.049, expected="lower") == "refuted"
  assert st.verdict(diff=-0.1, p_adj=0.049, expected="lower") == "reproduced"
  assert st.verdict(diff=0.1, p_adj=0.05, expected="higher") == "inconclusive"
  assert st.verdict(diff=0.1, p_adj=None, expected="higher") == "inconclusive"
  with pytest.raises(ValueError, match="expected"):
    st.verdict(diff=0.1, p_adj=0.01, expected="up")
