"""Tests written for the survivors of the mutation run over core/losses.py, loss_modes.py and
offpolicy.py (docs/testing.md): clip-event flags at their thresholds, the aux token count, and
argument errors naming the argument."""
import re

import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.core import losses, offpolicy


def _one(ratio, adv, **kw):
  """policy_loss on one token with log π − log π_old = log ratio and advantage adv."""
  logp = jnp.asarray([[float(np.log(ratio))]], jnp.float32)
  old = jnp.zeros((1, 1), jnp.float32)
  return losses.policy_loss(logp, old, jnp.asarray([adv], jnp.float32), jnp.ones((1, 1)), **kw)


def test_lower_clip_flag_only_below_one_minus_eps_low():
  _, aux = _one(0.9, -1.0, eps_low=0.2, eps_high=0.28)  # inside [0.8, 1.28]: not clipped
  assert float(aux["clipfrac_lower"]) == 0.0
  _, aux = _one(0.7, -1.0, eps_low=0.2, eps_high=0.28)
  assert float(aux["clipfrac_lower"]) == 1.0
  # A dual clip (r = 1.6 > c = 1.5, A < 0) is counted as such, not as a lower clip.
  _, aux = _one(1.6, -1.0, eps_low=0.2, eps_high=0.28, clip_c=1.5)
  assert float(aux["clipfrac_dual"]) == 1.0 and float(aux["clipfrac_lower"]) == 0.0


def test_cispo_upper_flag_for_any_positive_advantage():
  _, aux = _one(1.5, 0.5, mode="cispo", eps_high=0.28)  # capped weight, 0 < A < 1
  assert float(aux["clipfrac_upper"]) == 1.0
  _, aux = _one(1.5, -0.5, mode="cispo", eps_high=0.28)
  assert float(aux["clipfrac_upper"]) == 0.0


def test_aux_counts_the_loss_tokens():
  logp = jnp.zeros((2, 3), jnp.float32)
  mask = jnp.asarray([[1, 1, 0], [1, 0, 0]], jnp.float32)
  _, aux = losses.policy_loss(logp, logp, jnp.ones((2,)), mask)
  assert float(aux["num_tokens"]) == 3.0


@pytest.mark.parametrize("bad, name", [("logp", "logp_BxT"), ("old", "old_logp_BxT"),
                                       ("adv", "adv")])
def test_bad_ranks_name_the_argument(bad, name):
  args = dict(logp=jnp.zeros((2, 3)), old=jnp.zeros((2, 3)), adv=jnp.ones((2,)))
  args[bad] = jnp.zeros((2, 3, 1)) if bad != "adv" else jnp.ones((2, 3, 1))
  with pytest.raises(ValueError, match=f"^{name}: expected rank"):
    losses.policy_loss(args["logp"], args["old"], args["adv"], jnp.ones((2, 3)))


def test_resolve_params_names_dapo_and_its_parameter():
  with pytest.raises(ValueError, match=r"^eps_low: must be in \[0, 1\) for loss mode 'dapo'"):
    losses.resolve_params("dapo", dict(eps_low=1.5, eps_high=0.28, clip_c=None))
  assert losses.resolve_params("dapo", dict(eps_low=0.2, eps_high=0.28, clip_c=3.0)) == dict(
      eps_low=0.2, eps_high=0.28, clip_c=3.0)


@pytest.mark.parametrize("which, name", [("behav", "behav_logp_BxT: shape (2, 2) does not "
                                                   "match old_logp_BxT"),
                                         ("mask", "mask_BxT: shape (2, 2) does not match "
                                                  "old_logp_BxT")])
def test_is_correction_shape_errors_name_both_arrays(which, name):
  a = dict(old=jnp.zeros((2, 3)), behav=jnp.zeros((2, 3)), mask=jnp.ones((2, 3)))
  a[which] = a[which][:, :2]
  with pytest.raises(ValueError, match="^" + re.escape(name)):
    offpolicy.is_correction(a["old"], a["behav"], a["mask"], kind="tis_token")
