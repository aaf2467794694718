"""Group-relative advantages (GRPO / DAPO Eq. 9)."""
import jax.numpy as jnp

from dapo_jax.core._checks import check_array


def group_advantages(rewards_NxG, *, scale_by_std: bool = True, eps: float = 1e-6):
  """Â_i = (R_i − mean_G R) / (std_G R + eps), std unbiased (ddof = 1) as in the reference.

  With scale_by_std=False the advantage is R − mean (Dr. GRPO). A group of identical rewards gets
  0 either way. Returns adv_NxG in the rewards' floating dtype.
  """
  check_array(rewards_NxG, "rewards_NxG", ndim=2, kind="number")
  if rewards_NxG.shape[1] < 2:
    raise ValueError(f"rewards_NxG: group size (axis 1) must be >= 2 for ddof=1 std, "
                     f"got shape {tuple(rewards_NxG.shape)}")
  if not eps >= 0:
    raise ValueError(f"eps: must be >= 0, got {eps}")
  r = rewards_NxG.astype(jnp.promote_types(rewards_NxG.dtype, jnp.float32))
  mean_Nx1 = jnp.mean(r, axis=1, keepdims=True)
  centred = r - mean_Nx1
  if not scale_by_std:
    return centred
  std_Nx1 = jnp.std(r, axis=1, keepdims=True, ddof=1)
  return centred / (std_Nx1 + eps)
