"""The tests behind the notebook's verdicts: t intervals and two-sided p-values, Holm's
correction within a family of claims, and the power of the paired t test (seeds needed).

Pure functions of numbers (scipy's t and noncentral-t distributions); analysis.py applies them
to run logs. Every level here is two-sided.
"""
import dataclasses
import math

import numpy as np
from scipy import integrate
from scipy import stats as sps

ALPHA = 0.05   # family-wise error rate of every family of claims
POWER = 0.8    # the planning power of seeds_needed (verdicts.json's seeds_needed_80)
NAN = float("nan")
VERDICTS = ("reproduced", "refuted", "inconclusive")


@dataclasses.dataclass(frozen=True)
class TTest:
  """A two-sided t test of a mean difference: the estimate, the half-width of its 95 %
  interval (unadjusted), the unadjusted p-value, and the sd and number of the per-seed
  differences (one-sample / paired; Welch: sd nan, n the smaller arm)."""
  diff: float
  half: float
  p: float
  sd: float
  n: int
  paired: bool

  @property
  def reading(self) -> str:
    """'higher' / 'lower' when the unadjusted interval excludes 0, else 'overlapping'."""
    if not math.isfinite(self.half):
      return "insufficient"
    return ("higher" if self.diff - self.half > 0 else
            "lower" if self.diff + self.half < 0 else "overlapping")


def _finite(values) -> np.ndarray:
  return np.asarray([v for v in values if v is not None and math.isfinite(v)], np.float64)


def one_sample_t(values, *, level: float = 0.95) -> TTest:
  """Student's t test of mean = 0 over `values` (paired differences are one sample)."""
  x = _finite(values)
  n = x.size
  if n < 2:
    return TTest(float(x[0]) if n else NAN, NAN, NAN, NAN, n, True)
  m, sd = float(x.mean()), float(x.std(ddof=1))
  se = sd / math.sqrt(n)
  if se == 0:  # every difference equal: certain, unless they are all 0
    return TTest(m, 0.0, 1.0 if m == 0 else 0.0, sd, n, True)
  p = 2.0 * sps.t.sf(abs(m) / se, n - 1)
  return TTest(m, float(sps.t.ppf(0.5 + level / 2, n - 1) * se), float(p), sd, n, True)


def welch_t(a, b, *, level: float = 0.95) -> TTest:
  """Welch's unequal-variance t test of mean(a) − mean(b) (for arms whose seeds do not pair)."""
  a, b = _finite(a), _finite(b)
  n = min(a.size, b.size)
  if n < 2:
    return TTest(NAN, NAN, NAN, NAN, n, False)
  d = float(a.mean() - b.mean())
  va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
  se = math.sqrt(va + vb)
  if se == 0:
    return TTest(d, 0.0, 1.0 if d == 0 else 0.0, NAN, n, False)
  dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
  p = 2.0 * sps.t.sf(abs(d) / se, dof)
  return TTest(d, float(sps.t.ppf(0.5 + level / 2, dof) * se), float(p), NAN, n, False)


def holm(p_values) -> list[float]:
  """Holm's step-down adjusted p-values: the i-th smallest of m times (m − i + 1), made
  non-decreasing in that order and capped at 1. p_adj < α rejects exactly what Holm's
  procedure at family-wise level α rejects. A missing p (None / nan) still counts in m and
  stays nan."""
  p = np.asarray([NAN if v is None else float(v) for v in p_values], np.float64)
  m = p.size
  if m == 0:
    return []
  if ((p < 0) | (p > 1)).any():
    raise ValueError(f"holm: p-values must lie in [0, 1], got {p.tolist()}")
  filled = np.where(np.isnan(p), 1.0, p)
  order = np.argsort(filled, kind="stable")
  adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * filled[order]))
  out = np.empty(m)
  out[order] = adj
  out[np.isnan(p)] = NAN
  return out.tolist()


def power_t(*, effect: float, n: int, alpha: float) -> float:
  """Power of the two-sided one-sample (paired) t test at level alpha with n differences whose
  true mean is `effect` sds: P(|T| > t_crit) for T ~ noncentral t(df n − 1, ncp effect·√n).

  Computed directly, not with scipy's noncentral t (whose sf is nan at large noncentrality):
  T = (Z + ncp) / S with S = √(χ²_df / df) independent of Z ~ N(0, 1), so the power is
  E_S[Φ(ncp − t_crit·S) + Φ(−ncp − t_crit·S)], one smooth integral over S's quantiles."""
  if n < 2 or not 0 < alpha < 1:
    raise ValueError(f"power_t: need n >= 2 and 0 < alpha < 1, got n={n}, alpha={alpha}")
  df, ncp = n - 1, abs(effect) * math.sqrt(n)
  if math.isnan(ncp):
    return NAN
  if math.isinf(ncp):
    return 1.0
  crit = float(sps.t.ppf(1 - alpha / 2, df))
  s_dist = sps.chi(df, scale=1 / math.sqrt(df))

  def given_s(u: float) -> float:  # the power conditional on S at its quantile u
    s = float(s_dist.ppf(u))
    return float(sps.norm.cdf(ncp - crit * s) + sps.norm.cdf(-ncp - crit * s))

  value, _ = integrate.quad(given_s, 0.0, 1.0, epsabs=1e-12, epsrel=1e-10, limit=200)
  return float(min(1.0, max(0.0, value)))


def hedges_j(n: int) -> float:
  """Hedges' small-sample factor for a standardized paired difference from n seeds (df n − 1):
  E[d̂] = δ / J, so J·d̂ is (nearly) unbiased; J = Γ(df/2) / (√(df/2)·Γ((df − 1)/2))."""
  if n < 3:
    raise ValueError(f"hedges_j: need n >= 3 seeds (df >= 2), got {n}")
  df = n - 1
  return float(math.exp(math.lgamma(df / 2) - math.lgamma((df - 1) / 2)) / math.sqrt(df / 2))


def seeds_needed(*, effect: float, alpha: float, power: float = POWER,
                 max_n: int = 1_000_000) -> int | None:
  """Smallest n >= 2 whose power_t reaches `power`; None for no effect (0, nan) or n > max_n.
  Power grows with n, so a doubling search then bisection finds it."""
  e = abs(effect)
  if math.isnan(e) or e == 0:
    return None
  if math.isinf(e) or power_t(effect=e, n=2, alpha=alpha) >= power:
    return 2
  lo, hi = 2, 4
  while power_t(effect=e, n=hi, alpha=alpha) < power:
    if hi >= max_n:
      return None
    lo, hi = hi, min(2 * hi, max_n)
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (lo, mid) if power_t(effect=e, n=mid, alpha=alpha) >= power else (mid, hi)
  return hi


def verdict(*, diff: float, p_adj: float | None, expected: str, alpha: float = ALPHA) -> str:
  """'reproduced' when the adjusted p is below alpha and the difference has the paper's sign,
  'refuted' when below alpha with the other sign, 'inconclusive' otherwise."""
  if expected not in ("higher", "lower"):
    raise ValueError(f"verdict: expected must be 'higher' or 'lower', got {expected!r}")
  if p_adj is None or not math.isfinite(p_adj) or p_adj >= alpha or not diff:
    return "inconclusive"
  return "reproduced" if (diff > 0) == (expected == "higher") else "refuted"
