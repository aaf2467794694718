import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.core import stats


def test_masked_mean_and_empty():
  x = jnp.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  m = jnp.array([[1, 1, 0], [0, 0, 0]])
  assert float(stats.masked_mean(x, m)) == 1.5
  np.testing.assert_allclose(stats.masked_mean(x, m, axis=1), [1.5, 0.0])


def test_masked_mean_on_host_arrays_keeps_numpy_and_float64():
  x = np.array([[0.1, 0.2, 0.3]], np.float64)
  m = np.array([[True, True, False]])
  got = stats.masked_mean(x, m)
  assert isinstance(got, np.ndarray | np.floating) and got.dtype == np.float64
  assert float(got) == (0.1 + 0.2) / 2.0


def test_kl_estimators_values():
  logp = jnp.array([[np.log(0.5)]])
  ref = jnp.array([[np.log(0.25)]])
  d = np.log(0.5) - np.log(0.25)
  assert float(stats.kl_estimate(logp, ref, kind="k1")[0, 0]) == pytest.approx(d)
  assert float(stats.kl_estimate(logp, ref, kind="k2")[0, 0]) == pytest.approx(0.5 * d * d)
  assert float(stats.kl_estimate(logp, ref, kind="k3")[0, 0]) == pytest.approx(
      np.exp(-d) + d - 1)
  for k in stats.KL_KINDS:
    assert float(stats.kl_estimate(logp, logp, kind=k)[0, 0]) == 0.0


def test_kl_estimators_unbiased_for_k1_k3():
  # E_{x~p}[k1] = E_p[k3] = KL(p||q) on a categorical, by exact expectation.
  p = jnp.array([0.1, 0.2, 0.7])
  q = jnp.array([0.3, 0.3, 0.4])
  kl = float(jnp.sum(p * jnp.log(p / q)))
  lp, lq = jnp.log(p)[None], jnp.log(q)[None]
  for kind in ("k1", "k3"):
    est = float(jnp.sum(p * stats.kl_estimate(lp, lq, kind=kind)[0]))
    assert est == pytest.approx(kl, rel=1e-5)


def test_bad_kl_kind_and_shapes():
  with pytest.raises(ValueError, match="kind"):
    stats.kl_estimate(jnp.zeros((1, 2)), jnp.zeros((1, 2)), kind="k4")
  with pytest.raises(ValueError, match="ref_logp_BxT"):
    stats.kl_estimate(jnp.zeros((1, 2)), jnp.zeros((1, 3)))


def test_kl_default_is_k3_and_k3_clamped_above():
  # Mutation-test kills: the default estimator and the upper clamp. k3 = e^δ − δ − 1 >= 0, so
  # the lower clamp (−10) can never bind; δ = 5 gives e^5 − 6 ≈ 142, clamped to 10.
  logp = jnp.array([[0.0, 0.0]])
  ref = jnp.array([[5.0, -5.0]])  # δ = log π_ref − log π = 5, −5
  np.testing.assert_array_equal(stats.kl_estimate(logp, ref),
                                stats.kl_estimate(logp, ref, kind="k3"))
  got = stats.kl_estimate(logp, ref, kind="k3")
  assert float(got[0, 0]) == 10.0
  assert float(got[0, 1]) == pytest.approx(np.exp(-5.0) + 5.0 - 1.0, rel=1e-6)


@pytest.mark.parametrize("logp, ref, msg", [
    (jnp.zeros((1, 2, 1)), jnp.zeros((1, 2)), r"^logp_BxT: expected rank 2, got shape \(1, 2, 1\)"),
    (jnp.zeros((1, 2), jnp.int32), jnp.zeros((1, 2)), "^logp_BxT: expected a float dtype"),
    (jnp.zeros((1, 2)), jnp.zeros((2,)), r"^ref_logp_BxT: expected rank 2, got shape \(2,\)"),
    (jnp.zeros((1, 2)), jnp.zeros((1, 2), bool), "^ref_logp_BxT: expected a float dtype"),
    (jnp.zeros((1, 2)), jnp.zeros((1, 3)),
     r"^ref_logp_BxT: shape \(1, 3\) does not match logp_BxT \(1, 2\)$"),
])
def test_kl_bad_inputs_name_the_argument(logp, ref, msg):
  with pytest.raises(ValueError, match=msg):
    stats.kl_estimate(logp, ref)


def test_masked_stats_dtypes_under_x64_and_nan_padding():
  # float32 in -> float32 out with x64 on (a default-float cast would give float64); an empty
  # row is 0 even when its masked-out entries are NaN (padding), not NaN·0.
  with jax.enable_x64(True):
    x = jnp.array([[1.0, 3.0], [jnp.nan, 2.0]], jnp.float32)
    m = jnp.array([[1, 1], [0, 0]], jnp.int32)
    mean = stats.masked_mean(x, m, axis=1)
  assert mean.dtype == jnp.float32
  np.testing.assert_array_equal(mean, [2.0, 0.0])
