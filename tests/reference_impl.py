"""NumPy re-statements of the reference's (verl) formulas, used only as test oracles.

Written from the documented semantics of verl's `compute_grpo_outcome_advantage`,
`compute_policy_loss` (vanilla, with dual-clip) and `agg_loss`; loop-based on purpose so they share
no code with dapo_jax.core.
"""
import numpy as np


def grpo_advantage(rewards_NxG, eps=1e-6, norm_by_std=True):
  out = np.zeros_like(rewards_NxG, dtype=np.float64)
  for n, row in enumerate(rewards_NxG.astype(np.float64)):
    mean = row.mean()
    std = row.std(ddof=1)
    out[n] = (row - mean) / (std + eps) if norm_by_std else row - mean
  return out


def policy_loss_matrix(logp, old_logp, adv_BxT, eps_low, eps_high, clip_c):
  log_ratio = np.clip(logp - old_logp, -20.0, 20.0)
  ratio = np.exp(log_ratio)
  l1 = -adv_BxT * ratio
  l2 = -adv_BxT * np.clip(ratio, 1 - eps_low, 1 + eps_high)
  clip1 = np.maximum(l1, l2)
  if clip_c is None:
    return clip1
  l3 = -adv_BxT * clip_c
  clip2 = np.minimum(l3, clip1)
  return np.where(adv_BxT < 0, clip2, clip1)


def agg_loss(loss_mat, mask, mode, loss_scale_factor=None):
  mask = mask.astype(np.float64)
  if mode == "token-mean":
    return (loss_mat * mask).sum() / mask.sum()
  seq_tok = mask.sum(-1)
  seq_mask = (seq_tok > 0).astype(np.float64)
  if mode == "seq-mean-token-sum":
    seq = (loss_mat * mask).sum(-1)
  elif mode == "seq-mean-token-mean":
    seq = (loss_mat * mask).sum(-1) / (seq_tok + 1e-8)
  elif mode == "seq-mean-token-sum-norm":
    scale = loss_mask_len = mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
    del loss_mask_len
    seq = (loss_mat * mask).sum(-1) / scale
  else:
    raise KeyError(mode)
  return (seq * seq_mask).sum() / seq_mask.sum()


def soft_overlong(length, max_len, cache_len):
  expected = max_len - cache_len
  if length <= expected:
    return 0.0
  if length <= max_len and cache_len > 0:
    return (expected - length) / cache_len
  return -1.0
