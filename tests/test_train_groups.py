"""groups.training_batch (vectorised) equals the per-row loop it replaced, on random groups."""
import numpy as np
import pytest

from dapo_jax.core import overlong
from dapo_jax.train.groups import Groups, training_batch


def _loop_reference(groups, adv_NxG, seq_len, overlong_filter):
  """The pre-vectorisation implementation (one Python iteration per row)."""
  N, G, _ = groups.tokens.shape
  B = N * G
  out = {k: np.zeros((B, seq_len), np.float32)
         for k in ("attn_mask_BxS", "loss_mask_BxS", "behav_logp_BxS")}
  tokens, resp = np.zeros((B, seq_len), np.int32), np.zeros((B, seq_len), bool)
  keep = overlong.overlong_mask(groups.truncated) if overlong_filter else np.ones((N, G))
  keep = np.asarray(keep, np.float32)
  for n in range(N):
    p = groups.prompts[n]
    P = len(p)
    for g in range(G):
      row, L = n * G + g, int(groups.lengths[n, g])
      tokens[row, :P] = p
      tokens[row, P:P + L] = groups.tokens[n, g, :L]
      out["attn_mask_BxS"][row, :P + L] = 1.0
      out["loss_mask_BxS"][row, P:P + L] = keep[n, g]
      resp[row, P:P + L] = True
      out["behav_logp_BxS"][row, P:P + L] = groups.behav_logp[n, g, :L]
  return dict(out, tokens_BxS=tokens, adv_B=np.asarray(adv_NxG, np.float32).reshape(B)), resp


def _random_groups(rng, N=5, G=3, R=7):
  lengths = rng.integers(0, R + 1, size=(N, G)).astype(np.int32)
  mask = np.arange(R)[None, None, :] < lengths[..., None]
  return Groups(
      prompts=[rng.integers(1, 50, size=int(rng.integers(1, 6))).tolist() for _ in range(N)],
      answers=[""] * N, tokens=(rng.integers(1, 50, size=(N, G, R)) * mask).astype(np.int32),
      behav_logp=(-rng.random((N, G, R)) * mask).astype(np.float32),
      versions=np.zeros((N, G, R), np.int32), lengths=lengths,
      truncated=lengths == R, correct=np.zeros((N, G), bool), parsed=np.zeros((N, G), bool),
      score=np.zeros((N, G), np.float32), reward=np.zeros((N, G), np.float32))


@pytest.mark.parametrize("overlong_filter", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_training_batch_matches_loop(seed, overlong_filter):
  rng = np.random.default_rng(seed)
  groups = _random_groups(rng)
  adv = rng.standard_normal((5, 3))
  got, got_resp = training_batch(groups, adv, seq_len=14, overlong_filter=overlong_filter)
  want, want_resp = _loop_reference(groups, adv, 14, overlong_filter)
  np.testing.assert_array_equal(got_resp, want_resp)
  assert got.pack is None and got.old_logp_BxS is None and got.ref_logp_BxS is None
  for k in want:
    assert getattr(got, k).dtype == want[k].dtype, k
    np.testing.assert_array_equal(getattr(got, k), want[k], err_msg=k)


def test_training_batch_too_long_names_prompt():
  groups = _random_groups(np.random.default_rng(0))
  groups.prompts = [[1, 2]] * 5
  groups.lengths[:] = 0
  groups.lengths[2, 1] = 6
  with pytest.raises(ValueError, match=r"prompt 2 \(2 tokens\) \+ response \(6\)"):
    training_batch(groups, np.zeros((5, 3)), seq_len=7, overlong_filter=False)
