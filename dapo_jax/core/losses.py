"""The policy loss (DAPO's decoupled clip, Eq. 10, and the family in `core.loss_modes`) and the
loss aggregation (Eq. 12).

The exact token-level loss over a mini-batch that is split into micro-batches and data-parallel
shards comes from the (sum, count) form: `loss_denominator` counts tokens (or sequences) of the
WHOLE mini-batch once, each piece calls `policy_loss(..., denominator=that)`, and the pieces' losses
and gradients add up to the full-batch ones exactly. Under jit with sharded inputs the sums inside
are global, so data-parallel shards need nothing more.
"""
import collections.abc
import dataclasses

import jax
import jax.numpy as jnp

from dapo_jax.core import loss_modes
from dapo_jax.core._checks import check_array, check_same_shape
from dapo_jax.core.loss_modes import MODES
from dapo_jax.core.stats import masked_mean

AGG_MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_CLAMP = 20.0  # the reference clamps log π/π_old to ±20 before exp


def resolve_params(mode: str, given: dict) -> dict:
  """The mode's parameters: `given` where not None, else the paper default (`MODES`). The shared
  clip keys (eps_low, eps_high, clip_c) are accepted by every mode and dropped where unused; any
  other key the mode does not take is an error."""
  if mode not in MODES:
    raise ValueError(f"mode: unknown policy loss {mode!r}; expected one of {tuple(MODES)}")
  defaults = MODES[mode].defaults
  unknown = sorted(k for k in given if k not in defaults and k not in loss_modes.SHARED_KEYS)
  if unknown:
    raise ValueError(f"{unknown[0]}: not a parameter of loss mode {mode!r} (its parameters: "
                     f"{sorted(defaults)})")
  params = {k: given[k] if given.get(k) is not None else v for k, v in defaults.items()}
  if mode == "dapo":  # clip_c = None means "no dual clip", not "the default"
    params["clip_c"] = given.get("clip_c")
  check_loss_params(mode, params)
  return params


def check_loss_params(mode: str, params: dict):
  for k, v in params.items():
    ok, wording = loss_modes.RANGES[k]
    if not ok(v):
      raise ValueError(f"{k}: {wording} for loss mode {mode!r}, got {v}")
  lb, ub = params.get("clip_cov_lb"), params.get("clip_cov_ub")
  if lb is not None and ub is not None and not lb < ub:
    raise ValueError(f"clip_cov_lb: must be < clip_cov_ub={ub}, got {lb}")


def check_agg(agg: str, loss_scale_factor=None, mode: str = "dapo"):
  if agg not in AGG_MODES:
    raise ValueError(f"agg: unknown loss aggregation {agg!r}; expected one of {AGG_MODES}")
  if mode in MODES and MODES[mode].sequence_level and agg.startswith("seq-mean-token-sum"):
    raise ValueError(f"agg: {agg!r} would multiply the per-sequence loss of {mode!r} by the "
                     "sequence length (TRL #3823); use seq-mean-token-mean (the paper) or "
                     "token-mean (length-weighted)")
  if loss_scale_factor is not None and not loss_scale_factor > 0:
    raise ValueError(f"loss_scale_factor: must be > 0, got {loss_scale_factor}")


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




def _prepare(logp_BxT, old_logp_BxT, adv, mask_BxT):
  """Checks shapes and dtypes; returns (log_ratio, logp, adv, mask) as [B, T] float arrays."""
  check_array(logp_BxT, "logp_BxT", ndim=2, kind="float")
  check_array(old_logp_BxT, "old_logp_BxT", ndim=2, kind="float")
  check_same_shape(logp_BxT, old_logp_BxT, "logp_BxT", "old_logp_BxT")
  check_array(mask_BxT, "mask_BxT", ndim=2, kind="number")
  check_same_shape(logp_BxT, mask_BxT, "logp_BxT", "mask_BxT")
  check_array(adv, "adv", ndim=(1, 2), kind="float")
  if adv.ndim == 1 and adv.shape[0] != logp_BxT.shape[0]:
    raise ValueError(f"adv: per-sequence shape {tuple(adv.shape)} does not match batch "
                     f"{logp_BxT.shape[0]} of logp_BxT")
  if adv.ndim == 2:
    check_same_shape(logp_BxT, adv, "logp_BxT", "adv")
  dtype = jnp.promote_types(logp_BxT.dtype, jnp.float32)
  logp = logp_BxT.astype(dtype)
  adv_BxT = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape).astype(dtype)
  log_ratio = jnp.clip(logp - old_logp_BxT.astype(dtype), -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
  return log_ratio, logp, adv_BxT, mask_BxT.astype(dtype)


def select_tokens(logp_BxT, old_logp_BxT, adv, mask_BxT, *, mode: str, key=None, **params):
  """The tokens a selecting mode (clip_cov, kl_cov) acts on, chosen over THIS whole batch:
  call it on the full mini-batch and pass the result to every micro-batch's `policy_loss` as
  `selected_BxT`. Deterministic for `key` (default PRNGKey(0)); no gradient flows through it."""
  if mode not in loss_modes.SELECTORS:
    raise ValueError(f"mode: {mode!r} selects no tokens; selecting modes: "
                     f"{tuple(loss_modes.SELECTORS)}")
  params = resolve_params(mode, params)
  log_ratio, logp, adv_BxT, m = jax.tree.map(
      jax.lax.stop_gradient, _prepare(logp_BxT, old_logp_BxT, adv, mask_BxT))
  key = jax.random.PRNGKey(0) if key is None else key
  return loss_modes.SELECTORS[mode](log_ratio, logp, adv_BxT, m, key=key, **params)


def policy_loss(logp_BxT, old_logp_BxT, adv, mask_BxT, *, mode: str = "dapo",
                agg: str | None = None, eps_low: float | None = None,
                eps_high: float | None = None, clip_c: float | None = None,
                loss_scale_factor=None, denominator=None, weight_BxT=None, selected_BxT=None,
                key=None, **mode_params) -> tuple[jax.Array, "PolicyLossStats"]:
  """A policy loss of the family (`core.loss_modes.MODES`) as a loss to minimise.

  mode: dapo (default) | gspo | gspo_token | cispo | geo_mean | sapo | gpg | clip_cov | kl_cov.
  agg: one of AGG_MODES; None = the mode's paper aggregation. Parameters left None (eps_low,
  eps_high, and the mode's own: tau_pos, tau_neg, clip_cov_ratio, clip_cov_lb, clip_cov_ub,
  kl_cov_ratio, kl_coef) take the mode's paper default; for dapo, clip_c None = no dual clip.
  denominator: the `loss_denominator` of the whole mini-batch when this call sees only one
  micro-batch of it; the micro-batch losses then sum to the exact full-batch loss.
  weight_BxT: per-token weights (no gradient), e.g. an off-policy correction (core.offpolicy).
  selected_BxT: for clip_cov / kl_cov, `select_tokens` of the whole mini-batch; None = select
  from this call's batch with `key` (default PRNGKey(0)).
  Returns (loss, PolicyLossStats): clip fractions, Fig. 3a's up-clipped probability, approx KL,
  ratio mean / max and the token count, over this call's loss tokens.
  """
  params = resolve_params(mode, dict(mode_params, eps_low=eps_low, eps_high=eps_high,
                                     clip_c=clip_c))
  agg = MODES[mode].agg if agg is None else agg
  check_agg(agg, loss_scale_factor, mode)
  log_ratio, logp, adv_BxT, m = _prepare(logp_BxT, old_logp_BxT, adv, mask_BxT)
  if MODES[mode].selects and selected_BxT is None:
    selected_BxT = select_tokens(logp_BxT, old_logp_BxT, adv, mask_BxT, mode=mode, key=key,
                                 **params)
  if selected_BxT is not None:
    check_same_shape(logp_BxT, selected_BxT, "logp_BxT", "selected_BxT")
    params["selected_BxT"] = selected_BxT.astype(bool)
  own = (*MODES[mode].defaults, *(("selected_BxT",) if MODES[mode].selects else ()))
  loss_BxT, flags = MODES[mode].fn(log_ratio, logp, adv_BxT, m, **{k: params[k] for k in own})
  if weight_BxT is not None:
    check_same_shape(logp_BxT, weight_BxT, "logp_BxT", "weight_BxT")
    loss_BxT = loss_BxT * jax.lax.stop_gradient(weight_BxT.astype(loss_BxT.dtype))
  loss_BxT = loss_BxT * m
  loss = aggregate(loss_BxT, m, agg=agg, loss_scale_factor=loss_scale_factor,
                   denominator=denominator)
  return loss, _aux(flags, log_ratio, logp, m)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PolicyLossStats(collections.abc.Mapping):
  """What `policy_loss` reports of one call, over its loss tokens (scalars). Typed fields, and a
  read-only mapping by name (`aux["clipfrac"]`, `aux.items()`) for callers of the (loss, aux)
  form."""
  clipfrac: jax.Array          # share of tokens whose clip bound
  clipfrac_upper: jax.Array    # A > 0 tokens clipped at 1 + eps_high (Fig. 3a's tokens)
  clipfrac_lower: jax.Array    # A < 0 tokens clipped at 1 - eps_low
  clipfrac_dual: jax.Array     # A < 0 tokens capped by the dual clip c
  selected_frac: jax.Array     # tokens a Clip-/KL-Cov mode selected
  upclip_prob_mean: jax.Array  # mean probability of the up-clipped tokens (0 when none)
  num_upclipped: jax.Array     # their count
  approx_kl: jax.Array         # mean of log pi_old - log pi
  ratio_mean: jax.Array
  ratio_max: jax.Array         # 0 when there is no loss token
  num_tokens: jax.Array        # loss tokens

  def __getitem__(self, name: str):
    if name not in _STAT_NAMES:
      raise KeyError(name)
    return getattr(self, name)

  def __iter__(self):
    return iter(_STAT_NAMES)

  def __len__(self) -> int:
    return len(_STAT_NAMES)


_STAT_NAMES = tuple(f.name for f in dataclasses.fields(PolicyLossStats))


def _aux(flags, log_ratio, logp, m) -> PolicyLossStats:
  n_tok = jnp.sum(m)
  up = flags["clipped_upper"] * m
  n_up = jnp.sum(up)
  ratio = jnp.exp(log_ratio)
  frac = lambda k: masked_mean(flags[k], m)
  return PolicyLossStats(
      clipfrac=frac("clipped"), clipfrac_upper=frac("clipped_upper"),
      clipfrac_lower=frac("clipped_lower"), clipfrac_dual=frac("clipped_dual"),
      selected_frac=frac("selected"),
      upclip_prob_mean=jnp.sum(jnp.exp(logp) * up) / jnp.maximum(n_up, 1.0), num_upclipped=n_up,
      approx_kl=masked_mean(-log_ratio, m), ratio_mean=masked_mean(ratio, m),
      ratio_max=jnp.where(n_tok > 0, jnp.max(jnp.where(m > 0, ratio, -jnp.inf)), 0.0),
      num_tokens=n_tok)
