"""metrics.mismatch_figures: the sampler-vs-trainer log-prob gap the dashboard logs."""
import math

import numpy as np
import pytest

from dapo_jax import metrics


def test_figures_on_known_gaps():
  # Trainer minus sampler per token; the last column is padding with a huge gap (ignored).
  sampler = np.zeros((2, 5))
  trainer = np.array([[0.0, 0.1, -0.2, 1.0, 50.0], [-1.0, 0.3, 0.0, 0.05, -50.0]])
  mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 0]])
  out = metrics.mismatch_figures(trainer, sampler, mask, is_cap=2.0)
  d = np.array([0.0, 0.1, -0.2, 1.0, -1.0, 0.3, 0.0, 0.05])
  assert out["mismatch_k1"] == pytest.approx(-d.mean())
  assert out["mismatch_k3"] == pytest.approx(np.mean(np.exp(d) - d - 1))
  assert out["mismatch_abs_max"] == pytest.approx(1.0)
  assert out["mismatch_abs_p50"] == pytest.approx(np.median(np.abs(d)))
  assert out["mismatch_abs_p90"] == pytest.approx(np.percentile(np.abs(d), 90))
  # log 2 = 0.693: one token above the cap (tis_token truncates it), two outside the band.
  assert out["mismatch_capped_frac"] == pytest.approx(1 / 8)
  assert out["mismatch_outside_frac"] == pytest.approx(2 / 8)
  wide = metrics.mismatch_figures(trainer, sampler, mask, is_cap=math.e + 0.01)
  assert wide["mismatch_capped_frac"] == wide["mismatch_outside_frac"] == 0.0


def test_identical_and_empty():
  x = np.log(np.full((3, 4), 0.25))
  same = metrics.mismatch_figures(x, x, np.ones((3, 4)), is_cap=2.0)
  assert all(v == 0.0 for v in same.values())
  empty = metrics.mismatch_figures(x, x + 1, np.zeros((3, 4)), is_cap=2.0)
  assert set(empty) == set(same) and all(v == 0.0 for v in empty.values())
