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

The rollout-correction family of verl 0.9.1 (`compute_rollout_correction_weights`,
`compute_rollout_rejection_mask`), with log_ratio = trainer − sampler log-probs per token:

  is_weights      IS weights at level "token" (e^δ) or "sequence" (e^{Σδ} on every token),
                  truncated at a float threshold (TIS) or zeroed outside "lower_upper" (IcePop).
  rejection_mask  the loss mask with tokens / sequences dropped whose divergence estimate passes
                  a threshold: k1 = −δ (a band of ratios, "lower_upper"; one number u means
                  [1/u, u]), k2 = δ²/2, k3 = e^δ − 1 − δ (an upper bound), per token
                  (token_k*), or per sequence as the sum (seq_sum_k*), the mean (seq_mean_k*: the
                  geometric-mean ratio for k1, usable at 20k tokens) or the max (seq_max_k2/k3).
                  Options combine with commas; a token is kept only if every option keeps it.

Thresholds are parsed before tracing (strings are static); masks equal verl's exactly and
weights to float32 rounding (tests/test_core_offpolicy_verl.py, against verl's own functions).
"""
import math

import jax.numpy as jnp

from dapo_jax.core._checks import check_array, check_same_shape

IS_KINDS = ("none", "tis_token", "tis_seq", "mask_token", "mask_seq")
LOG_CLAMP = 20.0  # as the policy ratio: e^±20 is far beyond any cap
IS_LEVELS = ("token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


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


def _positive(where: str, text) -> float:
  try:
    v = float(text)
  except (TypeError, ValueError):
    raise ValueError(f"{where}: {text!r} is not a number") from None
  if not v > 0:
    raise ValueError(f"{where}: {text!r} must be > 0")
  return v


def _band(where: str, spec: str, *, k1: bool) -> tuple[float | None, float]:
  """(lower, upper) from "upper" or "lower_upper" (k1 and IcePop only)."""
  spec = str(spec).strip()
  if "_" in spec:
    if not k1:
      raise ValueError(f"{where}: {spec!r}: this option takes one upper bound, not lower_upper")
    lo, hi = (_positive(where, s) for s in spec.split("_", 1))
    if lo > hi:
      raise ValueError(f"{where}: {spec!r}: lower bound above the upper")
    return lo, hi
  return None, _positive(where, spec)


def parse_is_threshold(threshold) -> tuple[float | None, float]:
  """(lower, upper): a number or "u" truncates at u (TIS); "l_u" keeps weights in [l, u] (IcePop)."""
  if isinstance(threshold, bool) or not isinstance(threshold, (int, float, str)):
    raise ValueError(f"is_weights: threshold must be a number or a 'lower_upper' string, got "
                     f"{threshold!r}")
  return _band("is_weights: threshold", threshold, k1=True)


def parse_rs(options, thresholds) -> tuple[tuple[str, float | None, float], ...]:
  """((option, lower, upper), ...): comma-separated options (repeats dropped) and one threshold
  shared by all or one per option; a k1 option's single number u is the band [1/u, u]."""
  names = list(dict.fromkeys(o.strip() for o in str(options).split(",") if o.strip()))
  bad = [o for o in names if o not in RS_OPTIONS]
  if not names or bad:
    raise ValueError(f"rejection_mask: options {options!r}: unknown {bad or 'none given'}; "
                     f"expected a comma list of {RS_OPTIONS}")
  specs = [s.strip() for s in str(thresholds).split(",") if s.strip()]
  if len(specs) not in (1, len(names)):
    raise ValueError(f"rejection_mask: thresholds {thresholds!r}: give one shared by the "
                     f"{len(names)} options or one per option")
  out = []
  for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
    lo, hi = _band(f"rejection_mask: threshold of {name}", spec, k1=name.endswith("k1"))
    out.append((name, (1.0 / hi if lo is None else lo) if name.endswith("k1") else None, hi))
  return tuple(out)


def _masked_sum(x, m, axis=None):  # verl_F.masked_sum
  return jnp.sum(jnp.where(m > 0, x, 0.0) * m, axis=axis)


def _masked_mean(x, m, axis=None):  # verl_F.masked_mean: the 1e-8 keeps empty rows at 0
  return _masked_sum(x, m, axis) / (jnp.sum(m, axis=axis) + 1e-8)


def _inputs(log_ratio_BxT, mask_BxT):
  check_array(log_ratio_BxT, "log_ratio_BxT", ndim=2, kind="float")
  check_same_shape(log_ratio_BxT, mask_BxT, "log_ratio_BxT", "mask_BxT")
  return log_ratio_BxT.astype(jnp.float32), mask_BxT.astype(jnp.float32)


def is_weights(log_ratio_BxT, mask_BxT, *, level: str, threshold):
  """(weights_BxT, aux): verl's rollout IS weights (0 on padding) and, over the mask's tokens,
  `is_ess` (the effective sample share 1 / mean((w/mean w)²), verl's eff_sample_size),
  `is_weight_mean` and `is_outside_frac` (share of tokens whose raw weight the threshold
  truncated or zeroed)."""
  if level not in IS_LEVELS:
    raise ValueError(f"is_weights: level {level!r}; expected one of {IS_LEVELS}")
  lower, upper = parse_is_threshold(threshold)
  lr, m = _inputs(log_ratio_BxT, mask_BxT)
  if level == "sequence":
    lr = jnp.broadcast_to(_masked_sum(lr, m, axis=-1)[:, None], m.shape)
  raw = jnp.exp(jnp.clip(lr, -LOG_CLAMP, LOG_CLAMP)) * m
  if lower is None:
    w, outside = jnp.minimum(raw, upper), raw > upper
  else:
    outside = (raw < lower) | (raw > upper)
    w = jnp.where(outside, 0.0, raw)
  wc = jnp.clip(w, 0.0, upper)
  normed = wc / (_masked_mean(wc, m) + 1e-8)
  aux = {"is_ess": 1.0 / _masked_mean(normed**2, m), "is_weight_mean": _masked_mean(w, m),
         "is_outside_frac": _masked_mean(outside.astype(jnp.float32), m)}
  return w, aux


def _rs_keep(name: str, lower, upper, lr, m):
  """Where option `name` keeps a token ([B, T] bool; sequence options broadcast per row)."""
  k = {"k1": -lr, "k2": 0.5 * lr**2, "k3": jnp.exp(lr) - 1.0 - lr}[name[-2:]]
  if name.startswith("seq_sum"):
    k = _masked_sum(k, m, axis=-1)[:, None]
  elif name.startswith("seq_mean"):
    k = _masked_mean(k, m, axis=-1)[:, None]
  elif name.startswith("seq_max"):
    top = jnp.max(jnp.where(m > 0, k, -jnp.inf), axis=-1, keepdims=True)
    k = jnp.where(top == -jnp.inf, 0.0, top)
  if name.endswith("k1"):
    keep = (k >= math.log(lower)) & (k <= math.log(upper))
  else:
    keep = k <= upper
  return jnp.broadcast_to(keep, m.shape)


def rejection_mask(log_ratio_BxT, mask_BxT, *, options, thresholds):
  """(mask_BxT, aux): the mask (its dtype) with verl's rejected tokens set to 0, and
  `rs_token_frac` (share of the mask's tokens rejected), `rs_seq_frac` (share of rows with a
  rejected token), `rs_<option>_token_frac` per option."""
  specs = parse_rs(options, thresholds)
  lr, m = _inputs(log_ratio_BxT, mask_BxT)
  lr = jnp.clip(lr, -LOG_CLAMP, LOG_CLAMP)
  keep, aux = jnp.ones(m.shape, bool), {}
  for name, lower, upper in specs:
    kept = _rs_keep(name, lower, upper, lr, m)
    aux[f"rs_{name}_token_frac"] = _masked_mean(1.0 - kept, m)
    keep &= kept
  aux["rs_token_frac"] = _masked_mean(1.0 - keep, m)
  aux["rs_seq_frac"] = jnp.mean(jnp.any(~keep & (m > 0), axis=-1).astype(jnp.float32))
  return (mask_BxT * keep.astype(mask_BxT.dtype)).astype(mask_BxT.dtype), aux
