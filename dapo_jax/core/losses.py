"""The DAPO policy loss: decoupled clip (Eq. 10), dual clip, and loss aggregation (Eq. 12).

The exact token-level loss over a mini-batch that is split into micro-batches and data-parallel
shards comes from the (sum, count) form: `loss_denominator` counts tokens (or sequences) of the
WHOLE mini-batch once, each piece calls `policy_loss(..., denominator=that)`, and the pieces' losses
and gradients add up to the full-batch ones exactly. Under jit with sharded inputs the sums inside
are global, so data-parallel shards need nothing more.
"""
from typing import Any

import jax
import jax.numpy as jnp

from dapo_jax.core._checks import check_array, check_same_shape

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # the reference clamps log π/π_old to ±20 before exp


def check_clip_args(*, eps_low: float, eps_high: float, clip_c: float | None):
  if not eps_low >= 0:
    raise ValueError(f"eps_low: must be >= 0, got {eps_low}")
  if not eps_high >= 0:
    raise ValueError(f"eps_high: must be >= 0, got {eps_high}")
  if clip_c is not None and not clip_c > 1:
    raise ValueError(f"clip_c: dual-clip constant must be > 1 (or None to disable), got {clip_c}")


def check_agg(agg: str, loss_scale_factor=None):
  if agg not in AGG_MODES:
    raise ValueError(f"agg: unknown loss aggregation {agg!r}; expected one of {AGG_MODES}")
  if loss_scale_factor is not None and not loss_scale_factor > 0:
    raise ValueError(f"loss_scale_factor: must be > 0, got {loss_scale_factor}")


def per_token_policy_loss(logp_BxT, old_logp_BxT, adv, mask_BxT, *, eps_low: float = 0.2,
                          eps_high: float = 0.28, clip_c: float | None = None):
  """Per-token clipped surrogate as a loss, −min(r·A, clip(r, 1−ε_low, 1+ε_high)·A).

  adv: [B] (one advantage per sequence) or [B, T]. With clip_c, tokens with A < 0 have their loss
  capped at −A·c (dual-clip). Returns (loss_BxT, flags) where flags are float masks of clipping
  events per token (already multiplied by mask_BxT) and the ratio.
  """
  check_array(logp_BxT, "logp_BxT", ndim=2, kind="float")
  check_array(old_logp_BxT, "old_logp_BxT", ndim=2, kind="float")
  check_same_shape(logp_BxT, old_logp_BxT, "logp_BxT", "old_logp_BxT")
  check_array(mask_BxT, "mask_BxT", ndim=2, kind="number")
  check_same_shape(logp_BxT, mask_BxT, "logp_BxT", "mask_BxT")
  check_array(adv, "adv", ndim=(1, 2), kind="float")
  if adv.ndim == 1:
    if adv.shape[0] != logp_BxT.shape[0]:
      raise ValueError(f"adv: per-sequence shape {tuple(adv.shape)} does not match batch "
                       f"{logp_BxT.shape[0]} of logp_BxT")
    adv_BxT = jnp.broadcast_to(adv[:, None], logp_BxT.shape)
  else:
    check_same_shape(logp_BxT, adv, "logp_BxT", "adv")
    adv_BxT = adv
  check_clip_args(eps_low=eps_low, eps_high=eps_high, clip_c=clip_c)

  dtype = jnp.promote_types(logp_BxT.dtype, jnp.float32)
  mask = mask_BxT.astype(dtype)
  adv_BxT = adv_BxT.astype(dtype)
  log_ratio = jnp.clip(logp_BxT.astype(dtype) - old_logp_BxT.astype(dtype),
                       -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv_BxT * ratio
  clipped = -adv_BxT * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  loss = jnp.maximum(unclipped, clipped)
  neg_adv = adv_BxT < 0
  flags = {
      # The clip binds (its branch is the max and differs): gradient through r is zero.
      "clipped": (clipped > unclipped),
      "clipped_upper": (clipped > unclipped) & (adv_BxT > 0) & (ratio > 1.0 + eps_high),
      "clipped_lower": (clipped > unclipped) & neg_adv & (ratio < 1.0 - eps_low),
  }
  if clip_c is not None:
    dual_cap = -adv_BxT * clip_c
    flags["clipped_dual"] = neg_adv & (loss > dual_cap)
    loss = jnp.where(neg_adv, jnp.minimum(loss, dual_cap), loss)
  else:
    flags["clipped_dual"] = jnp.zeros_like(neg_adv)
  flags = {k: v.astype(dtype) * mask for k, v in flags.items()}
  return loss * mask, flags, ratio, log_ratio


def loss_denominator(mask_BxT, *, agg: str = "token-mean"):
  """The count that a full mini-batch's loss is divided by: tokens for token-mean, else the
  number of sequences with at least one loss token (fully masked sequences do not count)."""
  check_agg(agg)
  check_array(mask_BxT, "mask_BxT", ndim=2, kind="number")
  m = mask_BxT.astype(jnp.float32)
  if agg == "token-mean":
    return jnp.sum(m)
  return jnp.sum((jnp.sum(m, axis=1) > 0).astype(jnp.float32))


def loss_numerator(loss_BxT, mask_BxT, *, agg: str = "token-mean", loss_scale_factor=None):
  """The sum half of the (sum, count) form of each aggregation (reference `agg_loss` semantics).

  token-mean: Σ_tokens l; seq-mean-token-mean: Σ_seqs mean_t l; seq-mean-token-sum: Σ_seqs Σ_t l;
  seq-mean-token-sum-norm: Σ_seqs Σ_t l / loss_scale_factor (default T, Dr. GRPO). Assumes loss_BxT
  is already zero where mask_BxT is zero.
  """
  check_agg(agg, loss_scale_factor)
  m = mask_BxT.astype(loss_BxT.dtype)
  seq_sum_B = jnp.sum(loss_BxT * m, axis=1)
  if agg in ("token-mean", "seq-mean-token-sum"):
    return jnp.sum(seq_sum_B)
  if agg == "seq-mean-token-mean":
    count_B = jnp.sum(m, axis=1)
    return jnp.sum(jnp.where(count_B > 0, seq_sum_B / jnp.maximum(count_B, 1.0), 0.0))
  scale = loss_BxT.shape[1] if loss_scale_factor is None else loss_scale_factor
  return jnp.sum(seq_sum_B) / scale


def aggregate(loss_BxT, mask_BxT, *, agg: str = "token-mean", loss_scale_factor=None,
              denominator=None):
  """numerator / denominator; denominator defaults to this batch's own `loss_denominator`."""
  num = loss_numerator(loss_BxT, mask_BxT, agg=agg, loss_scale_factor=loss_scale_factor)
  den = loss_denominator(mask_BxT, agg=agg) if denominator is None else denominator
  # An empty batch (no loss tokens) has loss 0, not NaN.
  return jnp.where(den > 0, num / jnp.maximum(den, 1e-12), 0.0)


def policy_loss(logp_BxT, old_logp_BxT, adv, mask_BxT, *, eps_low: float = 0.2,
                eps_high: float = 0.28, clip_c: float | None = None, agg: str = "token-mean",
                loss_scale_factor=None, denominator=None) -> tuple[jax.Array, dict[str, Any]]:
  """The DAPO objective (Eq. 10 with Eq. 12's token-level sum) written as a loss to minimise.

  denominator: the `loss_denominator` of the whole mini-batch when this call sees only one
  micro-batch of it; the micro-batch losses then sum to the exact full-batch loss.
  Returns (loss, aux): aux has clip fractions (upper, lower, dual, any), the mean probability of
  up-clipped tokens (Fig. 3a), approx KL (mean of log π_old − log π), ratio mean / max, and the
  masked token count; fractions and means are over this call's loss tokens.
  """
  check_agg(agg, loss_scale_factor)
  loss_BxT, flags, ratio, log_ratio = per_token_policy_loss(
      logp_BxT, old_logp_BxT, adv, mask_BxT, eps_low=eps_low, eps_high=eps_high, clip_c=clip_c)
  loss = aggregate(loss_BxT, mask_BxT, agg=agg, loss_scale_factor=loss_scale_factor,
                   denominator=denominator)
  mask = mask_BxT.astype(loss_BxT.dtype)
  n_tok = jnp.sum(mask)
  safe_n = jnp.maximum(n_tok, 1.0)
  n_up = jnp.sum(flags["clipped_upper"])
  prob = jnp.exp(logp_BxT.astype(loss_BxT.dtype))
  aux = {
      "clipfrac": jnp.sum(flags["clipped"]) / safe_n,
      "clipfrac_upper": n_up / safe_n,
      "clipfrac_lower": jnp.sum(flags["clipped_lower"]) / safe_n,
      "clipfrac_dual": jnp.sum(flags["clipped_dual"]) / safe_n,
      # NaN-free: 0 when no token was up-clipped (the count is in aux too).
      "upclip_prob_mean": jnp.sum(prob * flags["clipped_upper"]) / jnp.maximum(n_up, 1.0),
      "num_upclipped": n_up,
      "approx_kl": jnp.sum(-log_ratio * mask) / safe_n,
      "ratio_mean": jnp.sum(ratio * mask) / safe_n,
      "ratio_max": jnp.where(n_tok > 0, jnp.max(jnp.where(mask > 0, ratio, -jnp.inf)), 0.0),
      "num_tokens": n_tok,
  }
  return loss, aux
