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


# ---- The policy-loss family, restated from the papers (loops over sequences and tokens). ----

def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def _seq_value_rows(logp, old, adv_BxT, mask, row_fn):
  """Sequence-level modes: l_i on every token of sequence i (0 for an empty one)."""
  out = np.zeros_like(logp, dtype=np.float64)
  for i in range(logp.shape[0]):
    idx = mask[i] > 0
    if idx.any():
      out[i] = row_fn(logp[i][idx] - old[i][idx], adv_BxT[i][idx])
  return out


def _gspo_row(lr, adv, el, eh):
  s = np.exp(min(np.mean(np.clip(lr, -20, 20)), 10.0))  # GSPO Eq. 7, log s clamped at 10
  a = np.mean(adv)
  return max(-a * s, -a * min(max(s, 1 - el), 1 + eh))


def _gmpo_row(lr, adv, el, eh):
  """GMPO Eq. 4: −A·(Π_t clip(r_t))^{1/|y|}, the clip pessimistic for the sign of A."""
  a = np.mean(adv)
  clipped = [min(x, eh) if a > 0 else (max(x, -el) if a < 0 else 0.0) for x in lr]
  return -a * np.exp(np.mean(clipped))


def mode_loss_matrix(mode, logp, old, adv_BxT, mask, p, selected=None):
  """Per-token loss of `mode` (the value; masking and aggregation are agg_loss's)."""
  lr = np.clip(logp - old, -20.0, 20.0)
  r = np.exp(lr)
  el, eh = p.get("eps_low"), p.get("eps_high")
  if mode == "dapo":
    return policy_loss_matrix(logp, old, adv_BxT, el, eh, p.get("clip_c"))
  if mode in ("gspo", "gspo_token"):
    return _seq_value_rows(logp, old, adv_BxT, mask, lambda x, a: _gspo_row(x, a, el, eh))
  if mode == "geo_mean":
    return _seq_value_rows(logp, old, adv_BxT, mask, lambda x, a: _gmpo_row(x, a, el, eh))
  if mode == "cispo":  # MiniMax-M1 Eq. 4-5, no lower bound on the IS weight
    return -np.minimum(r, 1 + eh) * adv_BxT * logp
  if mode == "sapo":  # SAPO Eq. 5-6
    tau = np.where(adv_BxT > 0, p["tau_pos"], p["tau_neg"])
    return -(4.0 / tau) * _sigmoid(tau * (r - 1.0)) * adv_BxT
  if mode == "gpg":
    return -adv_BxT * logp
  ppo = np.maximum(-adv_BxT * r, -adv_BxT * np.clip(r, 1 - (el or 0), 1 + (eh or 0)))
  if mode == "clip_cov":
    return np.where(selected, 0.0, ppo)
  if mode == "kl_cov":
    return -adv_BxT * r + np.where(selected, p["kl_coef"] * np.abs(lr), 0.0)
  raise KeyError(mode)


def mode_loss(mode, logp, old, adv_BxT, mask, agg, p, selected=None):
  return agg_loss(mode_loss_matrix(mode, logp, old, adv_BxT, mask, p, selected), mask, agg)


def finite_diff_grad(f, x, h=1e-6):
  """Central differences of a scalar f at x (float64)."""
  g = np.zeros_like(x, dtype=np.float64)
  for idx in np.ndindex(x.shape):
    xp, xm = x.astype(np.float64).copy(), x.astype(np.float64).copy()
    xp[idx] += h
    xm[idx] -= h
    g[idx] = (f(xp) - f(xm)) / (2 * h)
  return g


def cispo_token_mean_grad(logp, old, adv_BxT, mask, eps_high):
  """d/d log π of CISPO's token-mean loss: −sg(min(r, 1+ε_high))·A / N per loss token (the
  stop-gradient makes finite differences of the value the wrong oracle)."""
  r = np.exp(np.clip(logp - old, -20, 20))
  return -np.minimum(r, 1 + eps_high) * adv_BxT * mask / mask.sum()


def gspo_token_seq_mean_grad(logp, old, adv_BxT, mask, el, eh):
  """d/d log π_t of GSPO-token (Eq. 14, seq-mean-token-mean): −A_t·s_i/(|y_i|·#seqs) where the
  clip does not bind, 0 where it does."""
  g = np.zeros_like(logp, dtype=np.float64)
  n_seq = (mask.sum(1) > 0).sum()
  for i in range(logp.shape[0]):
    idx = mask[i] > 0
    if not idx.any():
      continue
    s = np.exp(min(np.mean(np.clip(logp[i][idx] - old[i][idx], -20, 20)), 10.0))
    for t in np.nonzero(idx)[0]:
      a = adv_BxT[i, t]
      binds = -a * min(max(s, 1 - el), 1 + eh) > -a * s
      g[i, t] = 0.0 if binds else -a * s / (idx.sum() * n_seq)
  return g


def kl_cov_selection(logp, adv_BxT, mask, ratio):
  """KL-Cov: the ⌊k·N⌋ (≥ 1) valid tokens of largest (A − Ā)(log π − mean log π)."""
  valid = mask > 0
  cov = (adv_BxT - adv_BxT[valid].mean()) * (logp - logp[valid].mean())
  flat = [(-cov[i, t], i * logp.shape[1] + t) for i, t in zip(*np.nonzero(valid))]
  k = max(int(ratio * valid.sum()), 1)
  sel = np.zeros_like(valid)
  for _, j in sorted(flat)[:k]:
    sel[j // logp.shape[1], j % logp.shape[1]] = True
  return sel


def clip_cov_eligible(logp, old, adv_BxT, mask, el, eh, lb, ub):
  """Clip-Cov's candidates: valid, not clipped by the PPO clip, covariance in (lb, ub)."""
  valid = mask > 0
  r = np.exp(np.clip(logp - old, -20, 20))
  clipped = -adv_BxT * np.clip(r, 1 - el, 1 + eh) > -adv_BxT * r
  cov = (adv_BxT - adv_BxT[valid].mean()) * (logp - logp[valid].mean())
  return valid & ~clipped & (cov > lb) & (cov < ub)
