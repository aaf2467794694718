"""The trainer's wiring, phase by phase: what reaches the loss, and what reaches the sampler.

Each test here is aimed at a bug that the end-to-end tests cannot see at a tiny model's scale:
advantages of the verifier score instead of the shaped reward, a sampler that keeps its initial
weights, an Eq. 13 ramp off by one token.
"""
import types

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.train import groups as groups_lib
from dapo_jax.train import batch as batch_lib, collector, trainer
from tests.test_trainer import fake_rewards, tiny_config  # noqa: F401  (autouse fixture)

# A learning rate at which one update visibly moves the weights and the sampled tokens.
FAST = {"optim.lr": 3e-2, "optim.warmup_steps": 0, "algo.max_gen_rounds": 8}


def _eq13(length: int, *, max_len: int, cache_len: int) -> float:
  """Eq. 13 restated from the paper (independent of dapo_jax.core.overlong)."""
  start = max_len - cache_len
  if length <= start:
    return 0.0
  if length <= max_len:
    return (start - length) / cache_len
  return -1.0


def _always_right(text, ground_truth):
  del text, ground_truth
  return 1.0, True, "1"


def _fake_rollout(lengths_NxG, max_len):
  N, G = lengths_NxG.shape
  return types.SimpleNamespace(
      tokens=np.full((N, G, max_len), 5, np.int32), lengths=lengths_NxG,
      logprobs=np.full((N, G, max_len), -0.5, np.float32),
      versions=np.zeros((N, G, max_len), np.int32), truncated=lengths_NxG >= max_len)


def test_score_rollout_applies_eq13_before_on_and_beyond_the_ramp():
  max_len, cache_len = 12, 4  # ramp over lengths 9..12
  lengths = np.array([[1, 8, 9, 10], [11, 12, 8, 3]], np.int32)
  g = groups_lib.score_rollout(
      _fake_rollout(lengths, max_len), [[1], [2]], ["1", "2"],
      decode=lambda toks: ["x"] * len(toks), reward_fn=_always_right, overlong_penalty=True,
      max_len=max_len, cache_len=cache_len, factor=1.0)
  want = np.array([[1.0 + _eq13(int(n), max_len=max_len, cache_len=cache_len) for n in row]
                   for row in lengths])
  np.testing.assert_allclose(g.reward, want, rtol=0, atol=1e-6)
  np.testing.assert_array_equal(g.score, np.ones_like(want))  # the verifier's score is untouched
  assert g.reward[0, 1] == 1.0 and g.reward[1, 1] == 0.0  # last free length; at the limit: -1
  off = groups_lib.score_rollout(
      _fake_rollout(lengths, max_len), [[1], [2]], ["1", "2"],
      decode=lambda toks: ["x"] * len(toks), reward_fn=_always_right, overlong_penalty=False,
      max_len=max_len, cache_len=cache_len, factor=1.0)
  np.testing.assert_array_equal(off.reward, off.score)


def test_score_rollout_fixes_the_group_dtypes():
  """Groups hold int32 tokens / lengths and float32 log-probs / rewards whatever the sampler
  handed over (the widths the Groups fields are declared with)."""
  r = _fake_rollout(np.array([[3, 5]], np.int64), 6)
  r.tokens, r.logprobs = r.tokens.astype(np.int64), r.logprobs.astype(np.float64)
  r.versions = r.versions.astype(np.int64)
  g = groups_lib.score_rollout(r, [[1]], ["1"], decode=lambda toks: ["x"] * len(toks),
                               reward_fn=_always_right, overlong_penalty=True, max_len=6,
                               cache_len=2, factor=1.0)
  assert (g.tokens.dtype, g.lengths.dtype, g.versions.dtype) == (np.int32,) * 3
  assert (g.behav_logp.dtype, g.reward.dtype) == (np.float32, np.float32)


def _batch(run, reward_NxG, score_NxG, lengths_NxG, truncated_NxG):
  N, G = reward_NxG.shape
  R = run.cfg.rollout.max_new_tokens
  rng = np.random.default_rng(0)
  return groups_lib.Groups(
      prompts=[[1, 4 + n, 9] for n in range(N)], answers=[str(n) for n in range(N)],
      tokens=rng.integers(4, 30, (N, G, R)).astype(np.int32),
      behav_logp=np.full((N, G, R), -1.0, np.float32), versions=np.zeros((N, G, R), np.int32),
      lengths=lengths_NxG.astype(np.int32),
      truncated=truncated_NxG, correct=score_NxG > 0, parsed=np.ones((N, G), bool),
      score=score_NxG.astype(np.float32),
      reward=reward_NxG.astype(np.float32))


def test_prepare_feeds_group_advantages_of_the_shaped_reward(tmp_path):
  cfg = tiny_config(**{"algo.overlong_filter": True})
  run = trainer.build(cfg, str(tmp_path), resume=False)
  N, G, R = cfg.train.batch_size, cfg.rollout.group_size, cfg.rollout.max_new_tokens
  rng = np.random.default_rng(1)
  score = np.where(rng.random((N, G)) < 0.5, 1.0, -1.0)
  score[:, 0], score[:, 1] = 1.0, -1.0  # every group mixed
  lengths = rng.integers(1, R + 1, (N, G))
  truncated = lengths == R
  reward = score - 0.25 * (lengths / R)  # shaped: differs from the score inside each group
  prep = trainer.prepare(run, _batch(run, reward, score, lengths, truncated))
  want = (reward - reward.mean(1, keepdims=True)) / (reward.std(1, ddof=1, keepdims=True)
                                                     + cfg.algo.adv_eps)
  np.testing.assert_allclose(prep.batch.adv_B, want.reshape(-1), rtol=1e-5, atol=1e-6)
  from_score = (score - score.mean(1, keepdims=True)) / (score.std(1, ddof=1, keepdims=True)
                                                         + cfg.algo.adv_eps)
  assert not np.allclose(prep.batch.adv_B, from_score.reshape(-1), atol=1e-3)
  # Overlong filtering: a truncated response has response tokens but no loss tokens.
  resp_B = prep.resp_mask_BxS.sum(1)
  loss_B = prep.batch.loss_mask_BxS.sum(1)
  np.testing.assert_array_equal(resp_B, lengths.reshape(-1))
  np.testing.assert_array_equal(loss_B, np.where(truncated.reshape(-1), 0, lengths.reshape(-1)))


def _pure(params):
  return jax.tree.map(np.asarray, nnx.to_pure_dict(params))


def test_rollout_step_syncs_the_trained_weights_into_the_sampler(tmp_path, monkeypatch):
  """The colocated loop frees the sampler's weights for the update (their HBM is the update's)
  and the sync refills them with the trained ones."""
  run = trainer.build(tiny_config(**FAST), str(tmp_path), resume=False)
  initial = _pure(run.loop.state.params)
  np.testing.assert_equal(_pure(run.sampler.engine.params), initial)
  held = []
  real_update = trainer.update

  def update(run, *args):
    held.append(run.sampler.engine._weights._synced)  # pylint: disable=protected-access
    with pytest.raises(RuntimeError, match="released for the update"):
      run.sampler.engine.params  # pylint: disable=pointless-statement
    return real_update(run, *args)

  monkeypatch.setattr(trainer, "update", update)
  trainer.rollout_step(run, trainer.jitted_update(run))
  assert held == [None]
  trained = _pure(run.loop.state.params)
  sampled_from = _pure(run.sampler.engine.params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=0, atol=0), sampled_from,
               trained)
  moved = jax.tree.leaves(jax.tree.map(lambda a, b: float(np.abs(a - b).max()), trained,
                                       initial))
  assert max(moved) > 1e-3, "one update at lr 3e-2 should move the weights"


def test_rollouts_depend_on_the_weights_at_the_test_learning_rate(tmp_path):
  """The premise of the resume/multi-host equality tests: at FAST's lr, a sampler that missed
  the sync would sample other tokens, so those tests can see a missing sync."""
  run = trainer.build(tiny_config(**FAST), str(tmp_path), resume=False)
  step_fn = trainer.jitted_update(run)
  prompts = [[1, 5, 9, 3]] * 2
  kw = dict(group_size=4, max_new_tokens=8, temperature=1.0, top_p=1.0, top_k=0, seed=7,
            eos_ids=run.task.eos_ids)
  before = run.sampler.sample_groups(prompts, **kw).tokens
  trainer.rollout_step(run, step_fn)
  after = run.sampler.sample_groups(prompts, **kw).tokens
  assert (before != after).any()


def test_score_responses_decodes_once_in_group_order_and_keeps_predictions():
  from dapo_jax import rewards  # pylint: disable=import-outside-toplevel
  tokens = np.arange(2 * 3 * 4).reshape(2, 3, 4).astype(np.int32)
  lengths = np.array([[1, 2, 0], [4, 3, 1]], np.int32)
  calls = []

  def decode(rows):
    calls.append(rows)
    return [" ".join(map(str, r)) for r in rows]

  def reward_fn(text, answer):  # right when the response's first token id ends in the answer
    first = text.split(" ")[0] if text else ""
    ok = first.endswith(answer)
    return (1.0 if ok else -1.0), ok, (first or None)

  score, correct, preds = rewards.score_responses(tokens, lengths, ["0", "5"], decode=decode,
                                                  reward_fn=reward_fn)
  assert calls == [[[0], [4, 5], [], [12, 13, 14, 15], [16, 17, 18], [20]]]
  assert preds == [["0", "4", None], ["12", "16", "20"]]
  np.testing.assert_array_equal(correct, [[True, False, False], [False, False, False]])
  np.testing.assert_array_equal(score, np.where(correct, 1.0, -1.0))


def test_off_policy_correction_reads_the_samplers_log_probs(tmp_path):
  """With is_correction on, the trainer hands the sampler's log-probs to the step as
  behav_logp (the recomputed ones become old_logp): the mismatch metric is then measured."""
  run = trainer.build(tiny_config(**{"algo.is_correction": "tis_token"}), str(tmp_path),
                      resume=False)
  m = trainer.rollout_step(run, trainer.jitted_update(run))
  # Sampler and trainer run the same f32 weights: log-probs agree to round-off, not exactly.
  assert 0.0 <= m["is_logp_diff_abs_mean"] < 1e-3
  assert "is_corrected_frac" in m


def test_one_update_per_step_takes_old_logprobs_from_its_own_forward(tmp_path):
  """train.num_minibatches = 1: prepare runs no log-prob pass, and the update (with its entropy
  and token-probability metrics) equals the one fed by the separate pass."""
  cfg = tiny_config(**{"train.num_minibatches": 1})
  assert batch_lib.on_policy_update(cfg)
  assert not batch_lib.on_policy_update(tiny_config())  # 2+ updates: later ones are off-policy
  run = trainer.build(cfg, str(tmp_path), resume=False)
  batch, _ = collector.collect(run)
  fused, separate = trainer.prepare(run, batch), trainer.prepare(run, batch, separate_pass=True)
  assert fused.logp_BxS is None and fused.batch.on_policy and not separate.batch.on_policy
  step_fn = trainer.jitted_update(run)
  start = jax.tree.map(np.copy, jax.device_get(run.loop.state))
  (m_sep,), (no_tokens,) = jax.device_get(trainer.update(run, step_fn, separate.batch))
  assert no_tokens is None
  params_sep = _pure(run.loop.state.params)
  run.loop.state = jax.device_put(start, jax.tree.map(lambda x: x.sharding, run.loop.state))
  (m_fused,), (tokens,) = jax.device_get(trainer.update(run, step_fn, fused.batch))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6),
               _pure(run.loop.state.params), params_sep)
  np.testing.assert_allclose(m_fused["loss"], m_sep["loss"], rtol=1e-5, atol=1e-7)
  resp = separate.resp_mask_BxS > 0
  np.testing.assert_allclose(tokens.logp_BxS[resp], separate.logp_BxS[resp], atol=1e-5)
  np.testing.assert_allclose(tokens.entropy_BxS[resp], separate.entropy_BxS[resp], atol=1e-5)
