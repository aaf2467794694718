import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dapo_jax.core import advantages, filtering
from tests import reference_impl as ref


def test_hand_computed_group():
  r = jnp.array([[1.0, -1.0, -1.0, -1.0]])
  # mean -0.5; unbiased std = sqrt((2.25 + 3*0.25) / 3) = 1.0
  adv = advantages.group_advantages(r, eps=0.0)
  np.testing.assert_allclose(adv, [[1.5, -0.5, -0.5, -0.5]], rtol=1e-6)
  np.testing.assert_allclose(advantages.group_advantages(r, scale_by_std=False),
                             [[1.5, -0.5, -0.5, -0.5]], rtol=1e-6)


def test_uniform_group_is_zero_and_finite():
  adv = advantages.group_advantages(jnp.full((3, 16), -1.0))
  assert np.all(np.asarray(adv) == 0.0)


@pytest.mark.parametrize("scale", [True, False])
@pytest.mark.parametrize("use_jit", [True, False])
def test_matches_reference_random(scale, use_jit):
  r = np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32)
  fn = lambda x: advantages.group_advantages(x, scale_by_std=scale)
  fn = jax.jit(fn) if use_jit else fn
  np.testing.assert_allclose(fn(jnp.asarray(r)), ref.grpo_advantage(r, norm_by_std=scale),
                             atol=1e-5, rtol=1e-5)


def test_scale_by_std_flip_changes_magnitude():
  r = jnp.array([[2.0, 0.0, 0.0, 0.0]])
  a_std = advantages.group_advantages(r)
  a_raw = advantages.group_advantages(r, scale_by_std=False)
  assert float(a_std[0, 0]) == pytest.approx(1.5, rel=1e-5)  # std = 1
  assert float(a_raw[0, 0]) == pytest.approx(1.5)
  r2 = 10 * r  # scaling rewards: Dr.GRPO scales too, std-normalised does not
  assert float(advantages.group_advantages(r2)[0, 0]) == pytest.approx(1.5, rel=1e-5)
  assert float(advantages.group_advantages(r2, scale_by_std=False)[0, 0]) == pytest.approx(15.0)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.sampled_from([-1.0, 1.0, -1.5, 0.25]), min_size=2, max_size=8)
                .filter(lambda g: True), min_size=1, max_size=4))
def test_property_sum_to_zero(groups):
  g = min(len(x) for x in groups)
  r = jnp.asarray([x[:g] for x in groups], jnp.float32)
  adv = advantages.group_advantages(r)
  np.testing.assert_allclose(np.asarray(adv).sum(axis=1), 0.0, atol=1e-4)
  assert np.all(np.isfinite(np.asarray(adv)))


@pytest.mark.parametrize("bad, msg", [
    (jnp.zeros((4,)), r"^rewards_NxG: expected rank 2, got shape \(4,\)"),
    (jnp.zeros((4, 1)), r"^rewards_NxG: group size \(axis 1\) must be >= 2"),
])
def test_bad_shapes(bad, msg):
  with pytest.raises(ValueError, match=msg):
    advantages.group_advantages(bad)


def test_bad_dtype_and_eps():
  with pytest.raises(ValueError, match="^rewards_NxG: expected a number dtype"):
    advantages.group_advantages(np.array([["a", "b"]]))
  with pytest.raises(ValueError, match="^eps: must be >= 0"):
    advantages.group_advantages(jnp.zeros((2, 2)), eps=-1.0)


def test_dtype_float32_at_least_under_x64():
  # Integer and bfloat16 rewards give float32 advantages, float64 stays float64 (x64 on, where
  # a default-float cast would give float64 and a bf16 result would lose the mean's precision).
  with jax.enable_x64(True):
    for dtype, want in ((jnp.int32, jnp.float32), (jnp.bfloat16, jnp.float32),
                        (jnp.float64, jnp.float64)):
      adv = advantages.group_advantages(jnp.array([[1, -1, -1, -1]], dtype))
      assert adv.dtype == want, (dtype, adv.dtype)
      np.testing.assert_allclose(adv, [[1.5, -0.5, -0.5, -0.5]], rtol=1e-5)


def test_eps_is_added_to_the_std():
  # std = 1 here, so eps = 1 halves the advantages (std − eps would divide by zero).
  adv = advantages.group_advantages(jnp.array([[1.0, -1.0, -1.0, -1.0]]), eps=1.0)
  np.testing.assert_allclose(adv, [[0.75, -0.25, -0.25, -0.25]], rtol=1e-6)


def test_mixed_groups_exact():
  c = jnp.array([[True, False, False], [True, True, True], [False, False, False],
                 [False, True, True]])
  np.testing.assert_array_equal(filtering.mixed_groups(c), [True, False, False, True])
  np.testing.assert_array_equal(filtering.mixed_groups(c.astype(jnp.int32)),
                                [True, False, False, True])
  s = filtering.group_accuracy_stats(c)
  assert float(s["frac_groups_acc_1"]) == 0.25 and float(s["frac_groups_acc_0"]) == 0.25


def test_mixed_groups_rejects_float_rewards():
  # Filtering on shaped (float) rewards is the known failure mode; only correctness is accepted.
  with pytest.raises(ValueError, match="correct_NxG"):
    filtering.mixed_groups(jnp.array([[1.0, -1.2]]))
