"""Off-policy correction between the sampler's behaviour policy μ and the trainer's π_old.

The sampler's log-probs differ from the trainer's recomputation (bf16 sampler vs f32 trainer,
different kernels, a stale policy under asynchronous rollout). With δ = log π_old − log μ per
token, the correction (`kind`) is one of:

  none        no correction.
  tis_token   truncated IS per token: weight min(e^δ, cap) on each token's loss (Yao et al. 2025).
  tis_seq     truncated IS per sequence: weight min(e^{Σ_t δ}, cap) on all its tokens.
  mask_token  drop tokens whose e^δ lies outside [1/cap, cap] from the loss (and its count).
  mask_seq    drop whole sequences whose e^{Σ_t δ} lies outside [1/cap, cap].

The sequence kinds use the sequence's likelihood ratio (the product over its tokens, as verl's
`sequence` level), so over long responses the band must be wide. Weights carry no gradient.
"""
import jax.numpy as jnp

from dapo_jax.core._checks import check_array, check_same_shape

IS_KINDS = ("none", "tis_token", "tis_seq", "mask_token", "mask_seq")
LOG_CLAMP = 20.0  # as the policy ratio: e^±20 is far beyond any cap


def check_is_args(kind: str, cap: float):
  if kind not in IS_KINDS:
    raise ValueError(f"is_correction: unknown kind {kind!r}; expected one of {IS_KINDS}")
  if not cap > 1:
    raise ValueError(f"is_cap: must be > 1 (the truncation cap / band [1/cap, cap]), got {cap}")


def is_correction(old_logp_BxT, behav_logp_BxT, mask_BxT, *, kind: str, cap: float = 2.0):
  """Returns (weight_BxT, mask_BxT, aux): per-token loss weights (1 where not truncated), the
  loss mask with masked-out tokens removed, and metrics over the input mask's tokens:
  `is_logp_diff_abs_mean` (mean |δ|) and `is_corrected_frac` (share of tokens capped / masked).
  """
  check_is_args(kind, cap)
  check_array(old_logp_BxT, "old_logp_BxT", ndim=2, kind="float")
  check_array(behav_logp_BxT, "behav_logp_BxT", ndim=2, kind="float")
  check_same_shape(old_logp_BxT, behav_logp_BxT, "old_logp_BxT", "behav_logp_BxT")
  check_same_shape(old_logp_BxT, mask_BxT, "old_logp_BxT", "mask_BxT")
  m = mask_BxT.astype(jnp.promote_types(old_logp_BxT.dtype, jnp.float32))
  delta = (old_logp_BxT - behav_logp_BxT).astype(m.dtype) * m
  if kind.endswith("_seq"):
    delta = jnp.broadcast_to(jnp.sum(delta, axis=1, keepdims=True), m.shape)
  log_w = jnp.clip(delta, -LOG_CLAMP, LOG_CLAMP)
  log_cap = jnp.log(cap)
  weight, new_m = jnp.ones_like(m), m
  if kind.startswith("tis"):
    corrected = log_w > log_cap
    weight = jnp.exp(jnp.minimum(log_w, log_cap))
  elif kind.startswith("mask"):
    corrected = jnp.abs(log_w) > log_cap
    new_m = jnp.where(corrected, 0.0, m)
  else:
    corrected = jnp.zeros(m.shape, bool)
  n = jnp.maximum(jnp.sum(m), 1.0)
  aux = {"is_logp_diff_abs_mean": jnp.sum(jnp.abs(old_logp_BxT - behav_logp_BxT) * m) / n,
         "is_corrected_frac": jnp.sum(corrected * m) / n}
  return weight * m, new_m.astype(mask_BxT.dtype), aux
