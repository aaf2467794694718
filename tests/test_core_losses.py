import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from dapo_jax.core import losses
from tests import reference_impl as ref


def _random_batch(seed=0, B=8, T=12):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.5, size=(B, T)).astype(np.float32)
  old = (logp + rng.normal(0, 0.4, size=(B, T))).astype(np.float32)
  adv = rng.normal(size=(B,)).astype(np.float32)
  lengths = rng.integers(0, T + 1, size=(B,))
  lengths[0] = 0  # one fully masked sequence
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float32)
  return logp, old, adv, mask


def test_hand_computed_token_mean():
  # Two tokens: A=+1 with r=e^{0.5}≈1.6487 (clipped at 1.28), A=−1 with r=e^{-0.5}≈0.6065
  # (clipped at 0.8): losses −1.28 and +0.8 → mean −0.24.
  logp = jnp.array([[0.5, -0.5]])
  old = jnp.zeros((1, 2))
  adv = jnp.array([[1.0, -1.0]])
  loss, aux = losses.policy_loss(logp, old, adv, jnp.ones((1, 2)))
  assert float(loss) == pytest.approx((-1.28 + 0.8) / 2, abs=1e-6)
  assert float(aux["clipfrac_upper"]) == 0.5 and float(aux["clipfrac_lower"]) == 0.5
  assert float(aux["upclip_prob_mean"]) == pytest.approx(np.exp(0.5), rel=1e-6)
  assert float(aux["approx_kl"]) == pytest.approx(0.0, abs=1e-7)


def test_dual_clip_caps_negative_advantage():
  # A = −1, r = e^3 ≈ 20.1: plain clip gives loss 20.1; dual-clip c=10 caps at 10.
  logp, old, adv, m = jnp.array([[3.0]]), jnp.zeros((1, 1)), jnp.array([-1.0]), jnp.ones((1, 1))
  plain, _ = losses.policy_loss(logp, old, adv, m)
  dual, aux = losses.policy_loss(logp, old, adv, m, clip_c=10.0)
  assert float(plain) == pytest.approx(np.exp(3.0), rel=1e-5)
  assert float(dual) == pytest.approx(10.0) and float(aux["clipfrac_dual"]) == 1.0
  # Positive advantages are untouched by dual-clip.
  pos, _ = losses.policy_loss(logp, old, -adv, m, clip_c=10.0)
  assert float(pos) == pytest.approx(-1.28, rel=1e-6)


@pytest.mark.parametrize("agg", losses.AGG_MODES)
@pytest.mark.parametrize("clip_c", [None, 3.0])
@pytest.mark.parametrize("per_token_adv", [False, True])
@pytest.mark.parametrize("use_jit", [False, True])
def test_matches_reference(agg, clip_c, per_token_adv, use_jit):
  # A stable seed per case (hash() of a tuple with strings changes every process).
  logp, old, adv, mask = _random_batch(seed=10 * losses.AGG_MODES.index(agg) + (clip_c is not None))
  adv_BxT = np.broadcast_to(adv[:, None], logp.shape).copy()
  if per_token_adv:
    adv_BxT = adv_BxT + np.random.default_rng(1).normal(0, 0.3, logp.shape).astype(np.float32)
  adv_in = adv_BxT if per_token_adv else adv
  fn = functools.partial(losses.policy_loss, clip_c=clip_c, agg=agg, eps_low=0.2, eps_high=0.28)
  fn = jax.jit(fn) if use_jit else fn
  loss, _ = fn(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv_in), jnp.asarray(mask))
  want = ref.agg_loss(ref.policy_loss_matrix(logp.astype(np.float64), old, adv_BxT, 0.2, 0.28,
                                             clip_c), mask, agg)
  assert float(loss) == pytest.approx(want, abs=1e-5, rel=1e-5)


def test_loss_scale_factor():
  logp, old, adv, mask = _random_batch()
  a, _ = losses.policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm")
  b, _ = losses.policy_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm",
                            loss_scale_factor=2 * logp.shape[1])
  assert float(a) == pytest.approx(2 * float(b), rel=1e-6)


def _loss_fn(logp, old, adv, mask, denominator=None, agg="token-mean"):
  return losses.policy_loss(logp, old, adv, mask, agg=agg, denominator=denominator)[0]


@pytest.mark.parametrize("agg", losses.AGG_MODES)
def test_microbatch_accumulation_is_exact(agg):
  """Gradients accumulated over k micro-batches with the global denominator == full batch."""
  logp, old, adv, mask = (jnp.asarray(x) for x in _random_batch(seed=3, B=12, T=10))
  full_loss, full_grad = jax.value_and_grad(_loss_fn)(logp, old, adv, mask, agg=agg)
  den = losses.loss_denominator(mask, agg=agg)
  for k in (2, 3, 4):
    acc_loss, acc_grad = 0.0, jnp.zeros_like(logp)
    for idx in np.array_split(np.arange(12), k):
      l, g = jax.value_and_grad(_loss_fn)(logp[idx], old[idx], adv[idx], mask[idx], den, agg)
      acc_loss += l
      acc_grad = acc_grad.at[idx].set(g)
    np.testing.assert_allclose(acc_loss, full_loss, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(acc_grad, full_grad, rtol=1e-6, atol=1e-7)


def test_per_microbatch_token_mean_is_not_global():
  """The legacy slip: mean of per-micro-batch token means differs from the global token mean."""
  logp, old, adv, mask = (jnp.asarray(x) for x in _random_batch(seed=5, B=8, T=10))
  full = float(_loss_fn(logp, old, adv, mask))
  halves = np.array_split(np.arange(8), 2)
  legacy = np.mean([float(_loss_fn(logp[i], old[i], adv[i], mask[i])) for i in halves])
  den = losses.loss_denominator(mask)
  exact = sum(float(_loss_fn(logp[i], old[i], adv[i], mask[i], den)) for i in halves)
  assert exact == pytest.approx(full, rel=1e-6)
  assert abs(legacy - full) > 1e-4


def test_eps_high_flip():
  logp, old, adv, mask = _random_batch(seed=7, B=16, T=16)
  adv = np.abs(adv)  # positive advantages: only the upper bound can bind
  fracs = []
  for eps_high in (0.2, 0.28, 0.4, 10.0):
    _, aux = losses.policy_loss(logp, old, adv, mask, eps_high=eps_high)
    fracs.append(float(aux["clipfrac_upper"]))
  assert fracs[0] > fracs[1] > fracs[2] > 0 and fracs[3] == 0.0
  # Higher eps_high lets positive-advantage tokens raise their ratio further: lower loss.
  l_lo = float(losses.policy_loss(logp, old, adv, mask, eps_high=0.2)[0])
  l_hi = float(losses.policy_loss(logp, old, adv, mask, eps_high=0.4)[0])
  assert l_hi < l_lo


def test_agg_flip_changes_value():
  logp, old, adv, mask = _random_batch(seed=9)
  vals = {agg: float(losses.policy_loss(logp, old, adv, mask, agg=agg)[0])
          for agg in losses.AGG_MODES}
  assert len({round(v, 6) for v in vals.values()}) == 4


def test_empty_mask_gives_zero_not_nan():
  loss, aux = losses.policy_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.ones((2,)),
                                 jnp.zeros((2, 3)))
  assert float(loss) == 0.0 and all(np.isfinite(float(v)) for v in aux.values())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), eps_low=st.floats(0, 0.9), eps_high=st.floats(0, 2),
       clip_c=st.one_of(st.none(), st.floats(1.01, 20)))
def test_property_clip_fractions_in_unit_interval(seed, eps_low, eps_high, clip_c):
  logp, old, adv, mask = _random_batch(seed=seed)
  loss, aux = losses.policy_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high,
                                 clip_c=clip_c)
  assert np.isfinite(float(loss))
  for k in ("clipfrac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual"):
    assert 0.0 <= float(aux[k]) <= 1.0
  assert float(aux["clipfrac_upper"]) + float(aux["clipfrac_lower"]) <= float(aux["clipfrac"]) + 1e-6


@pytest.mark.parametrize("kw, msg", [
    (dict(eps_low=-0.1), "eps_low"), (dict(eps_high=-0.1), "eps_high"),
    (dict(clip_c=1.0), "clip_c"), (dict(clip_c=0.5), "clip_c"),
    (dict(agg="sequence-mean"), "agg"), (dict(loss_scale_factor=0), "loss_scale_factor"),
])
def test_bad_arguments(kw, msg):
  logp, old, adv, mask = _random_batch()
  with pytest.raises(ValueError, match=msg):
    losses.policy_loss(logp, old, adv, mask, **kw)


def test_bad_shapes_and_dtypes():
  logp, old, adv, mask = _random_batch()
  with pytest.raises(ValueError, match="old_logp_BxT"):
    losses.policy_loss(logp, old[:, :-1], adv, mask)
  with pytest.raises(ValueError, match="adv"):
    losses.policy_loss(logp, old, adv[:-1], mask)
  with pytest.raises(ValueError, match="logp_BxT"):
    losses.policy_loss(logp[0], old, adv, mask)
  with pytest.raises(ValueError, match="logp_BxT"):
    losses.policy_loss(logp.astype(np.int32), old, adv, mask)
  with pytest.raises(ValueError, match="mask_BxT"):
    losses.policy_loss(logp, old, adv, mask[:, :3])
