"""Dynamic sampling's group filter and group-accuracy stats: values counted by hand.

Written for mutation testing (docs/testing.md): integer correctness other than 0/1, and stats
whose two fractions differ, so a swapped key or a `!= 0` turned `!= 1` fails.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.core import filtering


def test_integer_correctness_is_nonzero():
  # 2 and -1 count as correct (non-zero), so [2, 0] is mixed and [2, -1] all-correct.
  c = jnp.array([[2, 0], [2, -1], [0, 0], [0, 3]], jnp.int32)
  np.testing.assert_array_equal(filtering.mixed_groups(c), [True, False, False, True])
  s = filtering.group_accuracy_stats(c)
  assert float(s["frac_groups_acc_1"]) == 0.25
  assert float(s["frac_groups_acc_0"]) == 0.25


def test_accuracy_fractions_are_not_swapped():
  # 1 all-correct, 2 all-wrong, 2 mixed groups of 3.
  c = jnp.array([[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 1, 1]], bool)
  s = filtering.group_accuracy_stats(c)
  assert set(s) == {"frac_groups_acc_1", "frac_groups_acc_0"}
  assert float(s["frac_groups_acc_1"]) == pytest.approx(0.2)
  assert float(s["frac_groups_acc_0"]) == pytest.approx(0.4)
  assert s["frac_groups_acc_1"].dtype == jnp.float32
  np.testing.assert_array_equal(filtering.mixed_groups(c), [False, False, False, True, True])


def test_fractions_are_float32_under_x64():
  with jax.enable_x64(True):
    s = filtering.group_accuracy_stats(jnp.array([[1, 1], [0, 1]], jnp.int64))
  assert {v.dtype for v in s.values()} == {jnp.dtype(jnp.float32)}
  assert float(s["frac_groups_acc_1"]) == 0.5 and float(s["frac_groups_acc_0"]) == 0.0


def test_jit_and_group_of_two():
  c = jnp.array([[True, False], [True, True], [False, False]])
  np.testing.assert_array_equal(jax.jit(filtering.mixed_groups)(c), [True, False, False])


@pytest.mark.parametrize("fn", [filtering.mixed_groups, filtering.group_accuracy_stats])
@pytest.mark.parametrize("bad, msg", [
    (jnp.zeros((4,), bool), r"^correct_NxG: expected rank 2, got shape \(4,\)"),
    (jnp.zeros((2, 2), jnp.float32), "^correct_NxG: expected a bool or int dtype"),
])
def test_bad_inputs_name_the_argument(fn, bad, msg):
  with pytest.raises(ValueError, match=msg):
    fn(bad)
