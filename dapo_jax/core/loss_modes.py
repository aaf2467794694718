"""The policy-loss family, one per-token function per mode, and the registry `MODES`.

Each mode maps (log_ratio, logp, adv, mask) of ONE mini-batch slice to a per-token loss [B, T]
(before masking) and boolean event flags; `core.losses.policy_loss` aggregates it. Notation: r =
π_θ/π_old per token (log r clamped to ±20 as the reference does), A the advantage, sg = stop
gradient, |y| the number of loss tokens of a sequence.

Sequence-level modes (`gspo`, `geo_mean`) compute one loss l_i per sequence and put its VALUE on
every loss token of that sequence, so `seq-mean-token-mean` is the paper's mean over sequences and
`token-mean` the length-weighted mean; the token-SUM aggregations would multiply l_i by |y| (the
TRL #3823 bug) and are rejected.

Token-selecting modes (`clip_cov`, `kl_cov`) take `selected_BxT` from `select_tokens`, computed
once over the WHOLE mini-batch (the reference selects per micro-batch), so a micro-batched or
sharded step selects exactly the tokens the full batch would.
"""
import dataclasses
from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from dapo_jax.core.stats import masked_mean

SEQ_LOG_RATIO_MAX = 10.0  # GSPO: log s_i clamped at 10 before exp (verl)
FLAG_KEYS = ("clipped", "clipped_upper", "clipped_lower", "clipped_dual", "selected")


def _flags(like, **given):
  """All FLAG_KEYS as boolean [B, T] arrays; the ones a mode does not raise are all False."""
  false = jnp.zeros(like.shape, bool)
  return {k: jnp.broadcast_to(given.get(k, false), like.shape) for k in FLAG_KEYS}


def _seq_mean(x_BxT, m_BxT):
  return masked_mean(x_BxT, m_BxT, axis=1)


def _ppo_clip(ratio, adv, eps_low, eps_high):
  """−min(r·A, clip(r, 1−ε_low, 1+ε_high)·A) and the event flags (DAPO Eq. 10)."""
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high)
  bind = clipped > unclipped  # the clip's branch is the max: gradient through r is zero
  return jnp.maximum(unclipped, clipped), dict(
      clipped=bind, clipped_upper=bind & (adv > 0) & (ratio > 1.0 + eps_high),
      clipped_lower=bind & (adv < 0) & (ratio < 1.0 - eps_low))


def dapo(log_ratio, logp, adv, m, *, eps_low, eps_high, clip_c):
  """DAPO Eq. 10 (decoupled clip) with optional dual clip: A < 0 tokens capped at −A·clip_c."""
  del logp, m
  loss, flags = _ppo_clip(jnp.exp(log_ratio), adv, eps_low, eps_high)
  if clip_c is not None:
    dual_cap = -adv * clip_c
    flags["clipped_dual"] = (adv < 0) & (loss > dual_cap)
    loss = jnp.where(adv < 0, jnp.minimum(loss, dual_cap), loss)
  return loss, _flags(loss, **flags)


def gspo(log_ratio, logp, adv, m, *, eps_low, eps_high):
  """GSPO (Zheng et al. 2025, Eq. 5-7): s_i = exp(mean_t log r), l_i = −min(s_i·A_i,
  clip(s_i)·A_i), A_i the sequence's advantage (mean over its tokens if given per token). Its
  gradient is s_i·A_i·mean_t ∇log π (paper Eq. 10). log s_i clamped at 10 (verl)."""
  del logp
  s_B = jnp.exp(jnp.minimum(_seq_mean(log_ratio, m), SEQ_LOG_RATIO_MAX))
  loss_B, flags = _ppo_clip(s_B, _seq_mean(adv, m), eps_low, eps_high)
  return jnp.broadcast_to(loss_B[:, None], m.shape), _flags(
      m, **{k: v[:, None] for k, v in flags.items()})


def gspo_token(log_ratio, logp, adv, m, *, eps_low, eps_high):
  """GSPO-token (Eq. 13-14): s_i,t = sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)], per-token advantages.
  Equal in value and gradient to `gspo` when A is constant over a sequence."""
  log_s_B = jnp.minimum(_seq_mean(log_ratio, m), SEQ_LOG_RATIO_MAX)
  log_s_BxT = logp - jax.lax.stop_gradient(logp) + jax.lax.stop_gradient(log_s_B)[:, None]
  loss, flags = _ppo_clip(jnp.exp(log_s_BxT), adv, eps_low, eps_high)
  return loss, _flags(loss, **flags)


def cispo(log_ratio, logp, adv, m, *, eps_high):
  """CISPO (MiniMax-M1 Eq. 4-5): −sg(min(r, 1+ε_high))·A·log π. The paper sets no lower bound
  on the IS weight (ε_low^IS large); verl also clips at 1−ε_low — not done here."""
  del m
  ratio = jnp.exp(log_ratio)
  weight = jax.lax.stop_gradient(jnp.minimum(ratio, 1.0 + eps_high))
  capped = ratio > 1.0 + eps_high
  loss = -weight * adv * logp
  return loss, _flags(loss, clipped=capped, clipped_upper=capped & (adv > 0))


def geo_mean(log_ratio, logp, adv, m, *, eps_low, eps_high):
  """GMPO (Zhao et al. 2025, Eq. 4): l_i = −A_i·exp(mean_t clip_A(log r_t)), the clip taken in
  log space, sign-aware (A > 0: log r ≤ ε_high; A < 0: log r ≥ −ε_low). verl averages l_i over
  ALL rows (empty ones too); here over non-empty sequences (the paper's 1/G over responses)."""
  del logp
  sgn = jnp.sign(adv)
  clamped = jnp.clip(log_ratio, -eps_low, eps_high)
  log_r_min = sgn * jnp.minimum(sgn * log_ratio, sgn * clamped)
  loss_B = -_seq_mean(adv, m) * jnp.exp(_seq_mean(log_r_min, m))
  upper, lower = (adv > 0) & (log_ratio > eps_high), (adv < 0) & (log_ratio < -eps_low)
  return jnp.broadcast_to(loss_B[:, None], m.shape), _flags(
      m, clipped=upper | lower, clipped_upper=upper, clipped_lower=lower)


def sapo(log_ratio, logp, adv, m, *, tau_pos, tau_neg):
  """SAPO (Gao et al. 2025, Eq. 5-6): −f(r)·A with the soft gate f(r) = σ(τ(r−1))·4/τ, τ =
  τ_pos for A > 0 else τ_neg. f'(1) = 1, so on-policy it is the plain policy gradient."""
  del logp, m
  tau = jnp.where(adv > 0, tau_pos, tau_neg)
  gate = jax.nn.sigmoid(tau * (jnp.exp(log_ratio) - 1.0)) * 4.0 / tau
  loss = -gate * adv
  return loss, _flags(loss)


def gpg(log_ratio, logp, adv, m):
  """GPG (Chu et al. 2025, Eq. 4): −A·log π, no ratio and no clip (π_old is not used)."""
  del log_ratio, m
  loss = -adv * logp
  return loss, _flags(loss)


def clip_cov(log_ratio, logp, adv, m, *, eps_low, eps_high, clip_cov_ratio, clip_cov_lb,
             clip_cov_ub, selected_BxT):
  """Clip-Cov (Cui et al. 2025, Eq. 11): the clipped surrogate with the loss (value and
  gradient) of the selected high-covariance tokens set to 0, as the paper and verl. The
  selection's parameters act in `clip_cov_select`."""
  del logp, m, clip_cov_ratio, clip_cov_lb, clip_cov_ub
  loss, flags = _ppo_clip(jnp.exp(log_ratio), adv, eps_low, eps_high)
  return jnp.where(selected_BxT, 0.0, loss), _flags(loss, selected=selected_BxT, **flags)


def kl_cov(log_ratio, logp, adv, m, *, kl_cov_ratio, kl_coef, selected_BxT):
  """KL-Cov (Cui et al. 2025, Eq. 12): −r·A, plus kl_coef·|log r| on the selected tokens (verl's
  |log π − log π_old| as the KL term); no clip. kl_cov_ratio acts in `kl_cov_select`."""
  del logp, m, kl_cov_ratio
  loss = -adv * jnp.exp(log_ratio) + jnp.where(selected_BxT, kl_coef * jnp.abs(log_ratio), 0.0)
  return loss, _flags(loss, selected=selected_BxT)


def _rank(priority_N):
  """Position of each entry in ascending order (ties broken by index: deterministic)."""
  order = jnp.argsort(priority_N, stable=True)
  return jnp.zeros_like(order).at[order].set(jnp.arange(order.shape[0], dtype=order.dtype))


def _top_k(priority_BxT, eligible_BxT, k):
  """The k eligible entries of lowest priority (fewer if fewer are eligible)."""
  prio = jnp.where(eligible_BxT, priority_BxT, jnp.inf).reshape(-1)
  return eligible_BxT & (_rank(prio).reshape(eligible_BxT.shape) < k)


def _centered_cov(logp, adv, valid):
  """(A − mean A)(log π − mean log π) per token, means over the valid tokens (Cui et al. Eq. 9)."""
  n = jnp.maximum(jnp.sum(valid), 1)
  mean = lambda x: jnp.sum(jnp.where(valid, x, 0.0)) / n
  return (adv - mean(adv)) * (logp - mean(logp))


def _count(ratio, n_valid):
  # int(ratio · N) with at least 1, as the reference; computed on device from the mask.
  return jnp.maximum(jnp.floor(ratio * n_valid), 1.0)


def clip_cov_select(log_ratio, logp, adv, m, *, eps_low, eps_high, clip_cov_ratio, clip_cov_lb,
                    clip_cov_ub, key):
  """Clip-Cov's tokens: ⌊r·N⌋ (≥ 1) drawn uniformly (from `key`) among the valid, not already
  clipped tokens whose centred covariance lies in (lb, ub)."""
  valid = m > 0
  _, flags = _ppo_clip(jnp.exp(log_ratio), adv, eps_low, eps_high)
  cov = _centered_cov(logp, adv, valid)
  eligible = valid & ~flags["clipped"] & (cov > clip_cov_lb) & (cov < clip_cov_ub)
  priority = jax.random.uniform(key, m.shape)
  return _top_k(priority, eligible, _count(clip_cov_ratio, jnp.sum(valid)))


def kl_cov_select(log_ratio, logp, adv, m, *, kl_cov_ratio, kl_coef, key):
  """KL-Cov's tokens: the ⌊k·N⌋ (≥ 1) valid tokens of largest centred covariance."""
  del log_ratio, kl_coef, key
  valid = m > 0
  cov = _centered_cov(logp, adv, valid)
  return _top_k(-cov, valid, _count(kl_cov_ratio, jnp.sum(valid)))


# Each selector takes its mode's parameters (`Mode.defaults`) and a PRNG key.
SELECTORS = {"clip_cov": clip_cov_select, "kl_cov": kl_cov_select}


@dataclasses.dataclass(frozen=True)
class Mode:
  fn: Callable
  agg: str                          # the paper's aggregation (used when agg is not given)
  # The mode's parameters -> their paper defaults: the keywords of fn (and of its selector),
  # which a selecting mode's fn takes besides selected_BxT.
  defaults: Mapping[str, float | None]
  sequence_level: bool = False      # one loss value per sequence (no token-sum aggregation)
  selects: bool = False             # needs `select_tokens` over the whole mini-batch


_CLIP = dict(eps_low=0.2, eps_high=0.28)  # DAPO §3.1
MODES = {
    "dapo": Mode(dapo, "token-mean", dict(_CLIP, clip_c=None)),
    # GSPO §5.1: clipping ranges 3e-4 (left) and 4e-4 (right).
    "gspo": Mode(gspo, "seq-mean-token-mean", dict(eps_low=3e-4, eps_high=4e-4),
                 sequence_level=True),
    "gspo_token": Mode(gspo_token, "seq-mean-token-mean", dict(eps_low=3e-4, eps_high=4e-4)),
    # CISPO normalises by Σ|o_i| (token-mean); the paper gives no ε_high value: verl's 0.28.
    "cispo": Mode(cispo, "token-mean", dict(eps_high=0.28)),
    # GMPO §4: clip range (e^-0.4, e^0.4), i.e. 0.4 in log space.
    "geo_mean": Mode(geo_mean, "seq-mean-token-mean", dict(eps_low=0.4, eps_high=0.4),
                     sequence_level=True),
    "sapo": Mode(sapo, "seq-mean-token-mean", dict(tau_pos=1.0, tau_neg=1.05)),
    "gpg": Mode(gpg, "token-mean", {}),
    # Entropy Mechanism §5: r = 2e-4, ω_low = 1, ω_high = 5; ε = 0.2 (verl's clip_ratio).
    "clip_cov": Mode(clip_cov, "token-mean", dict(eps_low=0.2, eps_high=0.2, clip_cov_ratio=2e-4,
                                                  clip_cov_lb=1.0, clip_cov_ub=5.0),
                     selects=True),
    # KL-Cov: k = 2e-4 (the paper's 32B setting and verl's default), β = 1.
    "kl_cov": Mode(kl_cov, "token-mean", dict(kl_cov_ratio=2e-4, kl_coef=1.0), selects=True),
}
SHARED_KEYS = ("eps_low", "eps_high", "clip_c")  # accepted by every mode; unused ones ignored
# Each mode's own knobs (its keywords beyond the shared clip): config.algo.mode_params has one
# section per mode here holding exactly these (None = the paper default).
MODE_KNOBS = {name: tuple(k for k in m.defaults if k not in SHARED_KEYS)
              for name, m in MODES.items() if set(m.defaults) - set(SHARED_KEYS)}

# Range of every loss parameter: (test, wording). Messages start with the parameter's name.
RANGES = {
    "eps_low": (lambda v: 0 <= v < 1, "must be in [0, 1)"),
    "eps_high": (lambda v: v >= 0, "must be >= 0"),
    "clip_c": (lambda v: v is None or v > 1, "dual-clip constant must be > 1 (or None to disable)"),
    "tau_pos": (lambda v: v > 0, "must be > 0"),
    "tau_neg": (lambda v: v > 0, "must be > 0"),
    "clip_cov_ratio": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "clip_cov_lb": (lambda v: True, ""),
    "clip_cov_ub": (lambda v: True, ""),
    "kl_cov_ratio": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "kl_coef": (lambda v: v >= 0, "must be >= 0"),
}
