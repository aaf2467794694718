"""Dynamic-sampling group filter (DAPO Eq. 11's constraint 0 < |{o_i : correct}| < G)."""
import jax.numpy as jnp

from dapo_jax.core._checks import check_array


def mixed_groups(correct_NxG):
  """keep_N: True for groups whose number of correct answers is strictly between 0 and G.

  Works on correctness (booleans), never on the shaped reward: a group that is all wrong but of
  different lengths has different shaped rewards and must still be dropped.
  """
  check_array(correct_NxG, "correct_NxG", ndim=2, kind="bool_or_int")
  if jnp.issubdtype(correct_NxG.dtype, jnp.integer):
    c = correct_NxG != 0
  else:
    c = correct_NxG
  n_correct_N = jnp.sum(c.astype(jnp.int32), axis=1)
  return (n_correct_N > 0) & (n_correct_N < correct_NxG.shape[1])


def group_accuracy_stats(correct_NxG):
  """Fractions of groups that are all-correct and all-wrong (the paper's Fig. 3b)."""
  check_array(correct_NxG, "correct_NxG", ndim=2, kind="bool_or_int")
  acc_N = jnp.mean((correct_NxG != 0).astype(jnp.float32), axis=1)
  return {
      "frac_groups_acc_1": jnp.mean((acc_N == 1.0).astype(jnp.float32)),
      "frac_groups_acc_0": jnp.mean((acc_N == 0.0).astype(jnp.float32)),
  }
