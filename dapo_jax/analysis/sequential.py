"""A group-sequential confirmatory design: O'Brien–Fleming boundaries at pre-registered looks,
and Holm's step-down across a family of claims at each look.

The procedure (experiments/preregistration/*.json name it, experiments/confirm.py applies it):
- Each claim is a paired two-sided t test over seeds, taken at the looks n_1 < … < n_K seeds
  (information fractions t_k = n_k / n_K). A claim tested at overall level a rejects at look k
  when its p-value is below `nominal_levels(a, t)[k]`: the two-sided normal tail of the
  O'Brien–Fleming boundary b_k = c / √t_k, with c chosen so that a standard Brownian motion
  observed at the looks crosses ±b_k with probability a (computed, not tabled).
- Across the family (m claims, family-wise level α): each claim's **sequential p-value** by
  look k, q = the smallest overall level at which its O'Brien–Fleming test would have crossed
  at one of looks 1..k (`sequential_p`), then Holm's step-down on the q's (analysis_stats.holm
  gives the adjusted values; a claim rejects when its adjusted q is at most α). That is the
  closed test of weighted-Bonferroni group-sequential tests: a rejected claim's share of α
  passes to the others, and a claim that receives it is tested at its higher level at every
  look so far (Maurer & Bretz's graphical group-sequential procedures, which control the
  family-wise error rate). A claim rejected at a look stays rejected.
- A rejection reads `reproduced` when the difference has the paper's sign and `refuted`
  otherwise; a claim not rejected by the last look is `bounded` by its repeated confidence
  interval at the last look's nominal level; before the last look it is `undecided`.

The boundary crossing probabilities integrate the Brownian motion's density look by look on a
grid (Armitage, McPherson & Rowe's recursion), Simpson's rule on 801 points a look, within 1e-6 of the
finer grid's crossing probabilities.
"""
import functools
import math

import numpy as np
from scipy import integrate, optimize
from scipy import stats as sps

_GRID = 801  # points per look of the density recursion (odd, for Simpson's rule)


def _fractions(fractions) -> np.ndarray:
  t = np.asarray(fractions, np.float64)
  if t.ndim != 1 or t.size == 0 or (np.diff(t) <= 0).any() or t[0] <= 0 or t[-1] != 1.0:
    raise ValueError(f"analysis_sequential: information fractions must rise strictly to 1, "
                     f"got {list(fractions)}")
  return t


def crossing_prob(bounds, fractions, *, drift: float = 0.0) -> float:
  """P(|Z_k| >= bounds[k] at some look k), Z_k = W(t_k) / √t_k for a Brownian motion W with
  the given drift per unit information (W(t) ~ N(drift·t, t)); bounds are two-sided z values."""
  t = _fractions(fractions)
  b = np.asarray(bounds, np.float64)
  if b.shape != t.shape or (b <= 0).any():
    raise ValueError(f"crossing_prob: need one positive bound per look, got {list(bounds)}")
  stay = None  # density of W(t_k) on [-b_k √t_k, b_k √t_k] without a crossing so far
  prev_t, prev_x = 0.0, None
  for tk, bk in zip(t, b):
    half = bk * math.sqrt(tk)
    x = np.linspace(-half, half, _GRID)
    dt = tk - prev_t
    if stay is None:
      dens = sps.norm.pdf(x, loc=drift * tk, scale=math.sqrt(tk))
    else:
      kernel = sps.norm.pdf(x[:, None] - prev_x[None, :], loc=drift * dt, scale=math.sqrt(dt))
      dens = integrate.simpson(kernel * stay[None, :], x=prev_x, axis=1)
    stay, prev_t, prev_x = dens, tk, x
  return float(1.0 - integrate.simpson(stay, x=prev_x))


def obf_bounds(alpha: float, fractions) -> list[float]:
  """O'Brien–Fleming two-sided z boundaries c / √t_k whose crossing probability under no
  effect is alpha."""
  return list(_obf_bounds(float(alpha), tuple(float(f) for f in fractions)))


@functools.lru_cache(maxsize=256)
def _obf_bounds(alpha: float, fractions: tuple) -> tuple:
  if not 0 < alpha < 1:
    raise ValueError(f"obf_bounds: alpha must lie in (0, 1), got {alpha}")
  t = _fractions(fractions)
  scale = 1.0 / np.sqrt(t)
  c = optimize.brentq(lambda c: crossing_prob(c * scale, t) - alpha,
                      float(sps.norm.isf(alpha / 2)) * 0.5, 10.0, xtol=1e-10)
  return tuple((c * scale).tolist())


def nominal_levels(alpha: float, fractions) -> list[float]:
  """The two-sided p-value below which a claim rejects at each look (O'Brien–Fleming)."""
  return [float(2 * sps.norm.sf(b)) for b in obf_bounds(alpha, fractions)]


def power(*, effect: float, looks, alpha: float) -> float:
  """Probability that one claim rejects by the last look when its paired differences have true
  mean `effect` sds: the design's crossing probability under drift effect·√n_K (a normal
  approximation of the t statistics; t's heavier tails at 20 seeds lower it slightly)."""
  n = np.asarray(looks, np.float64)
  return crossing_prob(obf_bounds(alpha, n / n[-1]), n / n[-1],
                       drift=abs(effect) * math.sqrt(n[-1]))


def sequential_p(p_by_look, fractions) -> float:
  """A claim's sequential p-value after the looks taken so far: the smallest overall level at
  which its O'Brien–Fleming test (design `fractions`) has crossed at one of them. p_by_look[j]
  is the two-sided p at look j (None / nan: not tested, never crosses). At look j the test at
  level a crosses when z_j = Φ⁻¹(1 − p_j/2) ≥ c(a)/√t_j, and c(a) falls as a grows, so the
  smallest such a is the null crossing probability of the bounds z_j·√t_j / √t."""
  t = _fractions(fractions)
  if len(p_by_look) > t.size:
    raise ValueError(f"sequential_p: {len(p_by_look)} looks taken, the design has {t.size}")
  best = 1.0
  for j, p in enumerate(p_by_look):
    if p is None or not math.isfinite(p) or p >= 1.0:
      continue
    if p <= 0.0:
      return 0.0
    c = float(sps.norm.isf(p / 2)) * math.sqrt(t[j])
    best = min(best, _null_crossing(max(c, 1e-3), tuple(t.tolist())))
  return best


@functools.lru_cache(maxsize=4096)
def _null_crossing(c: float, fractions: tuple) -> float:
  t = np.asarray(fractions)
  return min(1.0, crossing_prob(c / np.sqrt(t), t))


def repeated_ci(*, diff: float, sd: float, n: int, level_p: float) -> tuple[float, float]:
  """The t interval diff ± t_{1 − level_p/2, n−1}·sd/√n at a look's nominal level (a repeated
  confidence interval: the set of effects the design would not reject at that look)."""
  if n < 2 or not (math.isfinite(diff) and math.isfinite(sd)):
    return (math.nan, math.nan)
  half = float(sps.t.isf(level_p / 2, n - 1)) * sd / math.sqrt(n)
  return (diff - half, diff + half)
