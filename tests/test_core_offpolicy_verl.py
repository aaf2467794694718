"""core.offpolicy's rollout-correction family against verl 0.9.1's own functions.

The oracle, tests/fixtures/verl_rollout_corr.npz, holds what verl's
`compute_rollout_rejection_mask` and `compute_rollout_correction_weights` returned on seeded
random log-ratios with padding (tests/fixtures/make_verl_rollout_corr.py runs them, from verl's
wheel, with torch): every rejection option alone, two comma-combinations, both IS levels with
truncation (TIS) and IcePop's band. Masks must be equal, weights within 1e-6 relative.
"""
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.core import offpolicy
from tests.fixtures import make_verl_rollout_corr as fixture

ORACLE = np.load(os.path.join(os.path.dirname(fixture.__file__), "verl_rollout_corr.npz"))
META = json.loads(str(ORACLE["meta"]))


def test_the_oracle_covers_every_option_and_both_levels():
  covered = {o for r in META["rs"] for o in r["options"].split(",")}
  assert covered == set(offpolicy.RS_OPTIONS)
  assert any("," in r["options"] for r in META["rs"])
  assert {(r["level"], "_" in r["threshold"]) for r in META["is"]} == {
      (lv, band) for lv in offpolicy.IS_LEVELS for band in (False, True)}
  lr, mask = fixture.inputs()  # the generator's inputs are the ones stored
  np.testing.assert_array_equal(lr, ORACLE["log_ratio"])
  np.testing.assert_array_equal(mask, ORACLE["mask"])


@pytest.mark.parametrize("i", range(len(META["rs"])))
def test_rejection_mask_equals_verl(i):
  case = META["rs"][i]
  f = jax.jit(functools.partial(offpolicy.rejection_mask, options=case["options"],
                                thresholds=case["thresholds"]))
  mask, aux = f(jnp.asarray(ORACLE["log_ratio"]), jnp.asarray(ORACLE["mask"]))
  want = ORACLE[f"rs{i}"]
  assert 0 < want.sum() < ORACLE["mask"].sum(), "a case that rejects nothing or everything"
  np.testing.assert_array_equal(np.asarray(mask), want)
  assert float(aux["rs_token_frac"]) == pytest.approx(case["token_frac"], rel=1e-6)
  assert float(aux["rs_seq_frac"]) == pytest.approx(case["seq_frac"], rel=1e-6)


@pytest.mark.parametrize("i", range(len(META["is"])))
def test_is_weights_equal_verl(i):
  case = META["is"][i]
  x = ORACLE["seq_log_ratio"] if case["level"] == "sequence" else ORACLE["log_ratio"]
  f = jax.jit(functools.partial(offpolicy.is_weights, level=case["level"],
                                threshold=case["threshold"]))
  w, aux = f(jnp.asarray(x), jnp.asarray(ORACLE["mask"]))
  want = ORACLE[f"is{i}"]
  np.testing.assert_allclose(np.asarray(w), want, rtol=1e-6, atol=0)
  assert float(aux["is_ess"]) == pytest.approx(case["ess"], rel=1e-5)
  assert float(aux["is_weight_mean"]) == pytest.approx(case["mean"], rel=1e-5)
  lo, hi = offpolicy.parse_is_threshold(case["threshold"])
  assert want.max() <= hi and (lo is None or want[want > 0].min() >= lo)


def test_the_band_kinds_agree_with_the_family():
  """mask_token at cap c drops what token_k1 at c drops; tis_token weighs as token TIS at c."""
  lr, mask = jnp.asarray(ORACLE["log_ratio"]), jnp.asarray(ORACLE["mask"])
  zeros = jnp.zeros_like(lr)
  _, m_old, _ = offpolicy.is_correction(lr, zeros, mask, kind="mask_token", cap=2.0)
  m_new, _ = offpolicy.rejection_mask(lr, mask, options="token_k1", thresholds="2.0")
  np.testing.assert_array_equal(np.asarray(m_old), np.asarray(m_new))
  w_old, _, _ = offpolicy.is_correction(lr, zeros, mask, kind="tis_token", cap=2.0)
  w_new, _ = offpolicy.is_weights(lr, mask, level="token", threshold=2.0)
  np.testing.assert_allclose(np.asarray(w_old), np.asarray(w_new), rtol=1e-6)


def test_the_mask_keeps_its_dtype():
  lr = jnp.asarray(ORACLE["log_ratio"])
  for dtype in (jnp.bool_, jnp.int32, jnp.float32):
    mask = jnp.asarray(ORACLE["mask"]).astype(dtype)
    out, _ = offpolicy.rejection_mask(lr, mask, options="token_k2", thresholds=0.3)
    assert out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out, np.float32), ORACLE["rs2"])


@pytest.mark.parametrize("options,thresholds,match", [
    ("token_k4", "1.0", "unknown \\['token_k4'\\]"),
    (" , ", "1.0", "none given"),
    ("seq_max_k1", "2.0", "unknown \\['seq_max_k1'\\]"),
    ("token_k1,token_k2", "2.0,0.3,0.1", "one shared by the 2 options or one per option"),
    ("token_k2", "0.5_2.0", "token_k2: '0.5_2.0': this option takes one upper bound"),
    ("token_k1", "2.0_0.5", "lower bound above the upper"),
    ("seq_sum_k3", "0", "seq_sum_k3: '0' must be > 0"),
    ("token_k3", "big", "'big' is not a number"),
])
def test_rejection_refuses_bad_options(options, thresholds, match):
  x = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match=match):
    offpolicy.rejection_mask(x, x, options=options, thresholds=thresholds)


@pytest.mark.parametrize("level,threshold,match", [
    ("tokens", 2.0, "level 'tokens'"), ("token", True, "a number or a 'lower_upper' string"),
    ("token", -1.0, "must be > 0"), ("sequence", "3_0.5", "lower bound above the upper"),
])
def test_is_weights_refuse_bad_thresholds(level, threshold, match):
  x = jnp.zeros((2, 3))
  with pytest.raises(ValueError, match=match):
    offpolicy.is_weights(x, x, level=level, threshold=threshold)
