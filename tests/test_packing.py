"""Padding-free updates (train/packing.py): the first-fit plan, pack/unpack round trips, the
device identity plan, and the packed update and log-prob pass equal to the padded layout
(loss, parameters, every metric; 1e-5), across aggregations, loss modes, micro-batching and
off-policy correction."""
import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.core import losses
from dapo_jax.models.qwen2 import Qwen2, token_logprobs
from dapo_jax.train import logprob_pass, packing
from tests.test_train_step import CFG, S, _batch, _cfg, _setup, _step


def _rows(lengths, s):
  mask = (np.arange(s)[None] < np.asarray(lengths)[:, None]).astype(np.float32)
  rng = np.random.default_rng(0)
  return (rng.integers(4, 30, mask.shape) * mask).astype(np.int32), mask


def test_first_fit_places_every_sequence_once_without_overlap():
  lengths = np.random.default_rng(1).integers(1, 21, 50)
  row, off = packing.first_fit(lengths, 20)
  cover = np.zeros((row.max() + 1, 20), int)
  for r, o, n in zip(row, off, lengths):
    cover[r, o:o + n] += 1
  assert cover.max() == 1 and cover.sum() == lengths.sum()
  assert row.max() + 1 < len(lengths)  # it packs
  assert row.max() + 1 <= -(-lengths.sum() // 20) * 11 // 9 + 1  # FFD: within 11/9 OPT + 1


@pytest.mark.parametrize("enabled", [False, True])
def test_pack_unpack_round_trip(enabled):
  tokens, mask = _rows(np.random.default_rng(2).integers(1, 21, 12), 20)
  plan = packing.pack(tokens, mask, micro_batches=3, enabled=enabled)
  back = lambda x: packing.unpack(x, plan, mask, micro_batches=3)
  np.testing.assert_array_equal(back(plan.tokens_BxS), tokens)
  np.testing.assert_array_equal(back(plan.positions_BxS), np.arange(20)[None] * mask)
  assert (plan.segments_BxS > 0).sum() == mask.sum()
  if not enabled:  # the identity plan runs every micro-batch
    assert packing.num_micro(plan.micro_B) == 3


def test_identity_plan_on_device_equals_the_host_plan():
  tokens, mask = _rows([5, 20, 1, 7, 9, 12], 20)
  host = packing.pack(tokens, mask, micro_batches=2, enabled=False)
  dev = packing.identity_plan(tokens, mask, micro_batches=2)
  for k in ("tokens_BxS", "segments_BxS", "src_BxS", "micro_B"):
    np.testing.assert_array_equal(np.asarray(getattr(dev, k)), getattr(host, k), err_msg=k)
  real = mask > 0
  np.testing.assert_array_equal(np.asarray(dev.positions_BxS)[real], host.positions_BxS[real])


@pytest.mark.parametrize("lengths, msg", [([0, 3], r"lengths must be in \[1, 4\]"),
                                          ([5, 3], r"lengths must be in \[1, 4\]")])
def test_pack_rejects_bad_lengths(lengths, msg):
  with pytest.raises(ValueError, match=msg):
    packing.first_fit(lengths, 4)


def test_pack_rejects_holes_and_bad_splits():
  tokens, mask = _rows([3, 4], 4)
  with pytest.raises(ValueError, match="micro-batches do not divide"):
    packing.pack(tokens, mask, micro_batches=3)
  mask[0, 1] = 0
  with pytest.raises(ValueError, match="run of real tokens from column 0"):
    packing.pack(tokens, mask, micro_batches=1)


def _packed(batch, cfg):
  plan = packing.pack(batch.tokens_BxS, batch.attn_mask_BxS, micro_batches=cfg.micro_batches)
  return dataclasses.replace(batch, pack=plan), plan


def _assert_packed_equals_padded(batch, cfg, tol=1e-5):
  graphdef, state, opt = _setup(cfg=cfg)
  padded, m_pad, _ = _step(graphdef, opt, cfg)(state, batch)
  packed_batch, plan = _packed(batch, cfg)
  graphdef, state, opt = _setup(cfg=cfg)
  packed, m_pack, _ = _step(graphdef, opt, cfg)(state, packed_batch)
  for a, b in zip(jax.tree.leaves(padded.params), jax.tree.leaves(packed.params)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=tol, atol=tol)
  assert set(m_pad) == set(m_pack)
  for k in m_pad:
    np.testing.assert_allclose(float(m_pack[k]), float(m_pad[k]), rtol=tol, atol=1e-7,
                               err_msg=k)
  return plan


@pytest.mark.parametrize("agg", losses.AGG_MODES)
@pytest.mark.parametrize("micro", [None, 4])
def test_packed_update_equals_padded(agg, micro):
  batch = _batch(seed=3)
  batch.loss_mask_BxS[[2, 7]] = 0.0  # overlong-filtered rows: no tokens, still packed
  cfg = _cfg(loss_agg=agg, micro_batch_size=micro)
  plan = _assert_packed_equals_padded(batch, cfg)
  if micro:  # short rows pack: fewer micro-batches run than the padded layout's 4
    assert packing.num_micro(plan.micro_B) < cfg.micro_batches


@pytest.mark.parametrize("mode, agg, mode_params", [
    ("gspo", "seq-mean-token-mean", None), ("geo_mean", "token-mean", None),
    ("cispo", "token-mean", None),
    ("clip_cov", "token-mean", dict(clip_cov_ratio=0.2, clip_cov_lb=-1e3, clip_cov_ub=1e3)),
    ("kl_cov", "token-mean", dict(kl_cov_ratio=0.1))])
def test_packed_update_equals_padded_for_loss_modes(mode, agg, mode_params):
  cfg = _cfg(loss_mode=mode, loss_agg=agg, eps_low=0.2, eps_high=0.2, micro_batch_size=4,
             mode_params=mode_params)
  _assert_packed_equals_padded(_batch(seed=4), cfg)


def test_packed_update_with_off_policy_correction_and_entropy():
  batch = _batch(seed=5)
  rng = np.random.default_rng(0)
  batch = dataclasses.replace(batch, behav_logp_BxS=batch.old_logp_BxS + rng.normal(
      0, 0.5, batch.old_logp_BxS.shape).astype(np.float32) * batch.loss_mask_BxS)
  cfg = _cfg(is_correction="tis_seq", is_cap=1.5, entropy_coef=0.01, kl_coef=0.1,
             micro_batch_size=2)
  _assert_packed_equals_padded(batch, cfg)


@pytest.mark.parametrize("impl", ["blocked", "plain"])
def test_packed_logprob_pass_equals_padded(impl):
  tokens, attn = _rows(np.random.default_rng(6).integers(2, S + 1, 12), S)
  loss_mask = attn * (np.arange(S)[None] > 0)
  mcfg = dataclasses.replace(CFG, attention_impl=impl, attention_chunk=4)
  graphdef, params = nnx.split(Qwen2(mcfg, rngs=nnx.Rngs(0)))
  want, want_ent = token_logprobs(nnx.merge(graphdef, params), tokens, attn)
  plan = packing.pack(tokens, attn, micro_batches=1)
  logp, ent = logprob_pass.logprob_fn(params, plan.tokens_BxS, plan.segments_BxS,
                                      plan.positions_BxS, graphdef=graphdef, mesh=None,
                                      temperature=1.0, with_entropy=True)
  unpack = lambda x: packing.unpack(np.asarray(x), plan, attn, micro_batches=1)
  resp = loss_mask > 0  # every token but each sequence's first (a prompt token)
  np.testing.assert_allclose(unpack(logp)[resp], np.asarray(want)[resp], atol=1e-5)
  np.testing.assert_allclose(unpack(ent)[resp], np.asarray(want_ent)[resp], atol=1e-5)
  assert packing.num_micro(plan.micro_B) == 1 and (plan.segments_BxS.max(1) > 1).any()
