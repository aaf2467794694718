"""The policy-loss family against NumPy restatements of each paper: values, gradients,
micro-batched == full batch, sharded == unsharded, token selection and off-policy correction."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from dapo_jax.core import losses, offpolicy
from dapo_jax.core.loss_modes import MODES
from tests import reference_impl as ref

# Parameters chosen so that clips and gates bind on the random batches below.
PARAMS = {
    "dapo": dict(eps_low=0.2, eps_high=0.28, clip_c=3.0),
    "gspo": dict(eps_low=0.05, eps_high=0.08),
    "gspo_token": dict(eps_low=0.05, eps_high=0.08),
    "cispo": dict(eps_high=0.28),
    "geo_mean": dict(eps_low=0.3, eps_high=0.3),
    "sapo": dict(tau_pos=1.0, tau_neg=1.05),
    "gpg": {},
    "clip_cov": dict(eps_low=0.2, eps_high=0.2, clip_cov_ratio=0.1, clip_cov_lb=-5.0,
                     clip_cov_ub=5.0),
    "kl_cov": dict(kl_cov_ratio=0.1, kl_coef=1.0),
}
SEQ_AGGS = ("token-mean", "seq-mean-token-mean")


def _aggs(mode):
  return SEQ_AGGS if MODES[mode].sequence_level else losses.AGG_MODES


def _batch(seed=0, B=8, T=12):
  rng = np.random.default_rng(seed)
  logp = rng.normal(-1.0, 0.5, size=(B, T))
  old = logp + rng.normal(0, 0.3, size=(B, T))
  adv = rng.normal(size=(B,))
  lengths = rng.integers(1, T + 1, size=(B,))
  lengths[0] = 0  # a fully masked sequence
  mask = (np.arange(T)[None, :] < lengths[:, None]).astype(np.float64)
  return logp, old, adv, mask


def _jax_loss(mode, agg, logp, old, adv, mask, selected=None, **kw):
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return losses.policy_loss(f32(logp), f32(old), f32(adv), f32(mask), mode=mode, agg=agg,
                            selected_BxT=selected, **PARAMS[mode], **kw)


def _selection(mode, logp, old, adv, mask):
  if not MODES[mode].selects:
    return None
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  return np.asarray(losses.select_tokens(f32(logp), f32(old), f32(adv), f32(mask), mode=mode,
                                         **PARAMS[mode]))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("seed", [0, 1])
def test_value_and_gradient_match_the_paper(mode, seed):
  logp, old, adv, mask = _batch(seed)
  adv_BxT = np.broadcast_to(adv[:, None], logp.shape)
  sel = _selection(mode, logp, old, adv, mask)
  for agg in _aggs(mode):
    want = ref.mode_loss(mode, logp, old, adv_BxT, mask, agg, PARAMS[mode], sel)
    got, _ = _jax_loss(mode, agg, logp, old, adv, mask, sel)
    assert float(got) == pytest.approx(want, rel=1e-5, abs=1e-6), agg
  agg = MODES[mode].agg
  grad = jax.grad(lambda lp: _jax_loss(mode, agg, lp, old, adv, mask, sel)[0])(
      jnp.asarray(logp, jnp.float32))
  if mode == "cispo":  # stop-gradient weight: an analytic oracle, not finite differences
    want_g = ref.cispo_token_mean_grad(logp, old, adv_BxT, mask, PARAMS[mode]["eps_high"])
  elif mode == "gspo_token":
    want_g = ref.gspo_token_seq_mean_grad(logp, old, adv_BxT, mask, 0.05, 0.08)
  else:
    want_g = ref.finite_diff_grad(
        lambda lp: ref.mode_loss(mode, lp, old, adv_BxT, mask, agg, PARAMS[mode], sel), logp)
  np.testing.assert_allclose(np.asarray(grad), want_g, rtol=2e-4, atol=2e-6)


def test_hand_computed_values():
  one = jnp.ones((1, 1))
  # SAPO on-policy: f(1) = 4/τ·σ(0) = 2/τ, so loss = −2A/τ_pos for A > 0.
  sapo, _ = losses.policy_loss(jnp.zeros((1, 1)), jnp.zeros((1, 1)), jnp.array([1.0]), one,
                               mode="sapo", tau_pos=2.0)
  assert float(sapo) == pytest.approx(-1.0)
  # CISPO: r = e^1 capped at 1.28, loss = −1.28·A·log π = −1.28·1·1.
  cispo, aux = losses.policy_loss(jnp.ones((1, 1)), jnp.zeros((1, 1)), jnp.array([1.0]), one,
                                  mode="cispo", eps_high=0.28)
  assert float(cispo) == pytest.approx(-1.28) and float(aux["clipfrac"]) == 1.0
  # GPG: −A·log π = −2·(−0.5).
  gpg, _ = losses.policy_loss(jnp.full((1, 1), -0.5), jnp.zeros((1, 1)), jnp.array([2.0]), one,
                              mode="gpg")
  assert float(gpg) == pytest.approx(1.0)
  # GSPO: log r = (0.1, 0.3) -> s = e^0.2 ≈ 1.2214 > 1 + 4e-4: clipped, loss = −(1 + 4e-4).
  gspo, aux = losses.policy_loss(jnp.array([[0.1, 0.3]]), jnp.zeros((1, 2)), jnp.array([1.0]),
                                 jnp.ones((1, 2)), mode="gspo")
  assert float(gspo) == pytest.approx(-(1 + 4e-4)) and float(aux["clipfrac_upper"]) == 1.0


def test_gspo_equals_gspo_token_for_sequence_advantages():
  logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _batch(3))
  for agg in SEQ_AGGS:
    fns = [lambda lp, m=m: _jax_loss(m, agg, lp, old, adv, mask)[0] for m in ("gspo", "gspo_token")]
    (va, ga), (vb, gb) = (jax.value_and_grad(f)(logp) for f in fns)
    assert float(va) == pytest.approx(float(vb), rel=1e-6)
    np.testing.assert_allclose(ga, gb, rtol=1e-5, atol=1e-8)


def test_sequence_level_losses_are_not_scaled_by_length():
  """GSPO's per-sequence loss must not grow with the sequence's length
  (https://github.com/huggingface/trl/issues/3823)."""
  adv = jnp.array([1.0, 1.0])
  mask = jnp.array([[1.0] + [0.0] * 9, [1.0] * 10])  # lengths 1 and 10, same log-ratio
  logp, old = jnp.full((2, 10), -1.0), jnp.full((2, 10), -1.02)
  for mode in ("gspo", "geo_mean"):
    per_seq = [float(losses.policy_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1],
                                        mask[i:i + 1], mode=mode)[0]) for i in range(2)]
    assert per_seq[0] == pytest.approx(per_seq[1], rel=1e-6)
    for agg in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
      with pytest.raises(ValueError, match="3823"):
        losses.policy_loss(logp, old, adv, mask, mode=mode, agg=agg)


@pytest.mark.parametrize("mode", list(MODES))
def test_microbatches_sum_to_the_full_batch(mode):
  """Global denominator + selection made once over the mini-batch: exact accumulation."""
  logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _batch(5, B=12, T=10))
  sel = _selection(mode, logp, old, adv, mask)
  for agg in _aggs(mode):
    fn = lambda lp, o, a, m, s, den: _jax_loss(mode, agg, lp, o, a, m, s, denominator=den)[0]
    full_l, full_g = jax.value_and_grad(fn)(logp, old, adv, mask, sel, None)
    den = losses.loss_denominator(mask, agg=agg)
    acc_l, acc_g = 0.0, jnp.zeros_like(logp)
    for idx in (np.arange(i, 12, 3) for i in range(3)):  # strided, as the train step
      s_i = None if sel is None else sel[idx]
      l, g = jax.value_and_grad(fn)(logp[idx], old[idx], adv[idx], mask[idx], s_i, den)
      acc_l, acc_g = acc_l + l, acc_g.at[idx].set(g)
    np.testing.assert_allclose(acc_l, full_l, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(acc_g, full_g, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mesh_shape, mode", [((8,), m) for m in MODES] + [
    ((2, 4), "clip_cov"), ((2, 4), "gspo")])
def test_sharded_equals_unsharded(cpu_devices, mesh_shape, mode):
  axes = ("data",) if len(mesh_shape) == 1 else ("data", "tensor")
  mesh = Mesh(np.asarray(cpu_devices).reshape(mesh_shape), axes)
  logp, old, adv, mask = (np.asarray(x, np.float32) for x in _batch(6, B=16, T=8))

  def fn(lp, o, a, m):  # selection inside: it must see the global batch under sharding
    loss_fn = lambda x: losses.policy_loss(x, o, a, m, mode=mode, **PARAMS[mode])
    (l, aux), g = jax.value_and_grad(loss_fn, has_aux=True)(lp)
    return l, g, aux["selected_frac"]

  want = jax.jit(fn)(logp, old, adv, mask)
  shard = lambda x: jax.device_put(x, NamedSharding(mesh, P("data")))
  got = jax.jit(fn)(*(shard(x) for x in (logp, old, adv, mask)))
  for g, w in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)


def test_kl_cov_selects_the_top_covariance_tokens():
  logp, old, adv, mask = _batch(7, B=10, T=12)
  adv_BxT = np.broadcast_to(adv[:, None], logp.shape)
  for ratio in (0.01, 0.1, 0.5):
    got = np.asarray(losses.select_tokens(jnp.asarray(logp, jnp.float32), old, adv,
                                          mask, mode="kl_cov", kl_cov_ratio=ratio))
    np.testing.assert_array_equal(got, ref.kl_cov_selection(logp, adv_BxT, mask, ratio))


def test_clip_cov_selects_k_eligible_tokens_deterministically():
  logp, old, adv, mask = _batch(8, B=10, T=12)
  adv_BxT = np.broadcast_to(adv[:, None], logp.shape)
  kw = dict(mode="clip_cov", eps_low=0.2, eps_high=0.2, clip_cov_lb=-0.5, clip_cov_ub=0.5)
  eligible = ref.clip_cov_eligible(logp, old, adv_BxT, mask, 0.2, 0.2, -0.5, 0.5)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  sel = lambda key, ratio: np.asarray(losses.select_tokens(
      f32(logp), f32(old), f32(adv), f32(mask), key=key, clip_cov_ratio=ratio, **kw))
  np.testing.assert_array_equal(sel(None, 1.0), eligible)  # k ≥ #eligible: all of them
  k = max(int(0.1 * mask.sum()), 1)
  assert 0 < k < eligible.sum()
  a, b, c = sel(jax.random.PRNGKey(1), 0.1), sel(jax.random.PRNGKey(1), 0.1), sel(
      jax.random.PRNGKey(2), 0.1)
  assert a.sum() == k and not (a & ~eligible).any()
  np.testing.assert_array_equal(a, b)
  assert (a != c).any()


@pytest.mark.parametrize("kw, msg", [
    (dict(mode="ppo"), "mode"), (dict(mode="dapo", tau_pos=1.0), "tau_pos"),
    (dict(mode="sapo", tau_neg=0.0), "tau_neg"), (dict(mode="clip_cov", clip_cov_ratio=0.0),
                                                   "clip_cov_ratio"),
    (dict(mode="clip_cov", clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb"),
    (dict(mode="kl_cov", kl_coef=-1.0), "kl_coef"), (dict(mode="gspo", eps_low=1.0), "eps_low"),
])
def test_bad_mode_arguments(kw, msg):
  logp, old, adv, mask = (jnp.asarray(x, jnp.float32) for x in _batch())
  with pytest.raises(ValueError, match=msg):
    losses.policy_loss(logp, old, adv, mask, **kw)


@pytest.mark.parametrize("kind", offpolicy.IS_KINDS)
def test_off_policy_correction_matches_definition(kind):
  rng = np.random.default_rng(11)
  mask = _batch(11, B=6, T=5)[3].astype(np.float32)
  old = rng.normal(-1, 0.3, mask.shape) * mask
  behav = (old + rng.normal(0, 0.4, mask.shape)) * mask
  cap = 1.6
  w, m, aux = offpolicy.is_correction(jnp.asarray(old, jnp.float32),
                                      jnp.asarray(behav, jnp.float32), mask, kind=kind, cap=cap)
  delta = (old - behav) * mask
  if kind.endswith("_seq"):
    delta = np.repeat(delta.sum(1, keepdims=True), mask.shape[1], axis=1)
  want_w, want_m, corrected = mask.copy(), mask.copy(), np.zeros(mask.shape, bool)
  if kind.startswith("tis"):
    want_w = np.minimum(np.exp(delta), cap) * mask
    corrected = np.exp(delta) > cap
  elif kind.startswith("mask"):
    corrected = (np.exp(delta) > cap) | (np.exp(delta) < 1 / cap)
    want_m = np.where(corrected, 0.0, mask)
  np.testing.assert_allclose(w, want_w, rtol=1e-5)
  np.testing.assert_array_equal(m, want_m)
  n = mask.sum()
  assert float(aux["is_corrected_frac"]) == pytest.approx((corrected * mask).sum() / n)
  assert float(aux["is_logp_diff_abs_mean"]) == pytest.approx(
      (np.abs(old - behav) * mask).sum() / n, rel=1e-5)
  if kind != "none":
    assert 0 < float(aux["is_corrected_frac"]) < 1


def test_off_policy_bad_arguments():
  x = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match="is_correction"):
    offpolicy.is_correction(x, x, x, kind="tis")
  with pytest.raises(ValueError, match="is_cap"):
    offpolicy.is_correction(x, x, x, kind="tis_token", cap=1.0)
