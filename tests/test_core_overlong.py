import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dapo_jax.core import overlong
from tests import reference_impl as ref


def test_reference_run_values():
  # L_max 20,480, L_cache 4,096: ramp 16,384 -> 20,480, -0.5 at 18,432 (PAPER.md).
  L = jnp.array([100, 16384, 16385, 18432, 20480, 20481, 10**6])
  p = overlong.soft_overlong_penalty(L, max_len=20480, cache_len=4096)
  np.testing.assert_allclose(p, [0, 0, -1 / 4096, -0.5, -1, -1, -1], atol=1e-7)


@pytest.mark.parametrize("use_jit", [True, False])
def test_matches_reference_formula(use_jit):
  L = np.arange(0, 200, 3)
  fn = lambda x: overlong.soft_overlong_penalty(x, max_len=128, cache_len=32)
  fn = jax.jit(fn) if use_jit else fn
  np.testing.assert_allclose(fn(jnp.asarray(L)), [ref.soft_overlong(l, 128, 32) for l in L],
                             atol=1e-6)


def test_factor_and_hard_cut():
  L = jnp.array([90, 100, 110])
  np.testing.assert_allclose(
      overlong.soft_overlong_penalty(L, max_len=100, cache_len=20, factor=0.5),
      [-0.25, -0.5, -0.5])
  # cache_len 0: Eq. 13 gives 0 up to and including max_len, -1 beyond (a hard cut).
  np.testing.assert_allclose(overlong.soft_overlong_penalty(L, max_len=100, cache_len=0),
                             [0, 0, -1])


@settings(max_examples=50, deadline=None)
@given(max_len=st.integers(1, 5000), frac=st.floats(0, 1), factor=st.floats(0, 3))
def test_property_monotone_and_clamped(max_len, frac, factor):
  cache = int(frac * max_len)
  L = jnp.arange(0, 2 * max_len + 2, max(1, max_len // 50))
  p = np.asarray(overlong.soft_overlong_penalty(L, max_len=max_len, cache_len=cache,
                                                factor=factor))
  assert np.all(np.diff(p) <= 1e-6), "penalty must not increase with length"
  assert p.min() >= -factor - 1e-6 and p.max() <= 1e-6
  assert np.allclose(p[np.asarray(L) > max_len], -factor)
  if cache > 0:
    assert np.allclose(p[np.asarray(L) == max_len], -factor)


@pytest.mark.parametrize("kw, msg", [
    (dict(max_len=10, cache_len=11), "cache_len"),
    (dict(max_len=0, cache_len=0), "max_len"),
    (dict(max_len=10, cache_len=-1), "cache_len"),
    (dict(max_len=10.5, cache_len=1), "max_len"),
    (dict(max_len=10, cache_len=1, factor=-1.0), "factor"),
])
def test_bad_args(kw, msg):
  with pytest.raises(ValueError, match=msg):
    overlong.soft_overlong_penalty(jnp.array([1]), **kw)


def test_overlong_mask():
  np.testing.assert_array_equal(overlong.overlong_mask(jnp.array([True, False])), [0.0, 1.0])
  with pytest.raises(ValueError, match="^truncated_B: expected a bool or int dtype"):
    overlong.overlong_mask(jnp.array([0.5]))


def test_overlong_mask_is_float32_under_x64():
  # The mask multiplies float32 losses; with x64 on, a default-float mask would be float64.
  with jax.enable_x64(True):
    m = overlong.overlong_mask(jnp.array([1, 0], jnp.int64))
  assert m.dtype == jnp.float32
  np.testing.assert_array_equal(m, [0.0, 1.0])


def test_adaptive_cache_len_edges():
  # max_len = 1 is valid (the smallest positive length); 0 is not, and the error names it.
  hist = {0: [np.array([1, 1])]}
  assert overlong.adaptive_cache_len(hist, step=1, window=1, percentile=50.0, max_len=1,
                                     fallback=0) == 0
  with pytest.raises(ValueError, match=r"^max_len: must be a positive int \(tokens\), got 0$"):
    overlong.adaptive_cache_len(hist, step=1, window=1, percentile=50.0, max_len=0, fallback=0)


def test_bad_lengths_name_the_argument():
  with pytest.raises(ValueError, match="^lengths: expected a number dtype"):
    overlong.soft_overlong_penalty(np.array(["a"]), max_len=10, cache_len=2)
