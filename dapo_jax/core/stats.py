"""Masked means and KL estimators for the optional KL term."""
import jax.numpy as jnp
import numpy as np

from dapo_jax.core._checks import check_array, check_same_shape

KL_KINDS = ("k1", "k2", "k3")


def masked_mean(x, mask, axis=None):
  """Mean of x over entries where mask is non-zero; 0 (not NaN) where the mask is empty.

  jnp arrays give jnp (traceable, at least float32); numpy arrays give numpy in their own
  precision (host metrics in float64)."""
  xp = np if isinstance(x, np.ndarray) and isinstance(mask, np.ndarray) else jnp
  m = mask.astype(xp.promote_types(x.dtype, xp.float32))
  total = xp.sum(x * m, axis=axis)
  count = xp.sum(m, axis=axis)
  return xp.where(count > 0, total / xp.maximum(count, 1.0), 0.0)


def kl_estimate(logp_BxT, ref_logp_BxT, *, kind: str = "k3"):
  """Per-token estimators of KL(π_θ || π_ref) from samples of π_θ (Schulman's k1 / k2 / k3).

  k1 = log π − log π_ref; k2 = ½ (log π − log π_ref)²; k3 = exp(δ) − δ − 1 with δ = log π_ref −
  log π, clamped to [−10, 10] like the reference's low-variance KL.
  """
  check_array(logp_BxT, "logp_BxT", ndim=2, kind="float")
  check_array(ref_logp_BxT, "ref_logp_BxT", ndim=2, kind="float")
  check_same_shape(logp_BxT, ref_logp_BxT, "logp_BxT", "ref_logp_BxT")
  if kind not in KL_KINDS:
    raise ValueError(f"kind: unknown KL estimator {kind!r}; expected one of {KL_KINDS}")
  log_ratio = logp_BxT - ref_logp_BxT
  if kind == "k1":
    return log_ratio
  if kind == "k2":
    return 0.5 * jnp.square(log_ratio)
  delta = -log_ratio
  return jnp.clip(jnp.exp(delta) - delta - 1.0, -10.0, 10.0)
