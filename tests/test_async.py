"""Rollout and training at the same time (train/pipeline.py): the synchronous loop unchanged at
max_staleness = 0, the staleness bound held and binding, partial rollouts, the behaviour
log-probs in the IS correction, a split placement whose rollout and update really overlap, and
impossible settings refused before any compile."""
import json
import os

import numpy as np
import pytest
from flax import nnx

from dapo_jax.core import filtering
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout.sampler import make_sampler
from dapo_jax.train import pipeline as pipeline_lib
from dapo_jax.train import rounds, trainer
from tests.test_trainer import _records, fake_rewards, tiny_config  # noqa: F401  (autouse)

ASYNC = {"rollout.max_staleness": 1, "rollout.partial": True, "algo.is_correction": "tis_token",
         "optim.lr": 3e-2, "optim.warmup_steps": 0}
WAITS = ("time_", "tokens_per_s")


def _train(cfg, workdir, *, pipeline=False):
  run = trainer.build(cfg, str(workdir), resume=False)
  # pipeline: the asynchronous loop's machinery, whatever max_staleness says
  trainer.train(run, resume=False, pipelined=True if pipeline else None)
  return _records(workdir)


def _raw_records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [r for r in map(json.loads, f) if r["kind"] == "train"]


def test_staleness_0_is_the_synchronous_loop(tmp_path):
  """The pipeline bounded at 0 waits for every update and sync before sampling, so it gives
  the synchronous loop's records bit for bit; and the loop reports staleness 0."""
  cfg = tiny_config(**{"train.num_steps": 3, "optim.lr": 3e-2, "optim.warmup_steps": 0})
  sync = _train(cfg, tmp_path / "sync")
  piped = _train(cfg, tmp_path / "piped", pipeline=True)
  assert sync == piped
  assert all(r["staleness_max"] == 0.0 and r["stale_token_frac"] == 0.0 for r in sync)


def _slow_update(monkeypatch):
  """The update 'runs' until the sampler can go no further: the bound then binds every step."""
  def ended(self, run):
    del run
    return self.in_flight is None or self.update_end is not None
  monkeypatch.setattr(pipeline_lib.Pipeline, "_update_ended", ended)


@pytest.mark.parametrize("k", [1, 2])
def test_no_token_trains_more_than_k_versions_late(tmp_path, monkeypatch, k):
  """With a slow update the sampler runs ahead as far as the bound lets it: staleness reaches
  k (the bound binds) and never exceeds it (a looser bound fails here)."""
  _slow_update(monkeypatch)
  cfg = tiny_config(**dict(ASYNC, **{"rollout.max_staleness": k, "rollout.partial": False,
                                     "train.num_steps": 2 + k}))
  recs = _train(cfg, tmp_path)
  assert [r["staleness_max"] for r in recs] == [0.0] + [float(min(s, k)) for s in range(1, 2 + k)]
  assert all(sum(r["staleness_counts"]) > 0 for r in recs)


def test_partial_rollout_versions_change_at_the_sync():
  """A weight sync between two decode chunks: unfinished sequences finish under the new
  weights, their later tokens carry the new version, earlier ones keep theirs."""
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
  sampler = make_sampler(Qwen2(cfg, rngs=nnx.Rngs(0)), num_slots=8, max_prompt_len=8,
                         max_len=40, steps_per_call=4)
  new_params = nnx.state(Qwen2(cfg, rngs=nnx.Rngs(1)), nnx.Param)
  prompts, kw = [[1, 2, 3], [4, 5], [6, 7, 8, 9]], dict(group_size=2, max_new_tokens=24, seed=5)
  calls = []

  def sync_after_first_chunk():
    calls.append(1)
    if len(calls) == 1:
      sampler.update_params(new_params, version=7)

  out = sampler.sample_groups(prompts, between_chunks=sync_after_first_chunk, **kw)
  resp = np.arange(24)[None, None, :] < out.lengths[:, :, None]
  assert (out.lengths > 4).all()  # every sequence ran past the first chunk, and finished
  v = np.where(resp, out.versions, -1)
  for n, g in np.ndindex(out.lengths.shape):
    seq = v[n, g][:out.lengths[n, g]]
    assert (seq[:4] == 0).all() and (seq[4:] == 7).all(), seq  # the switch at the sync
  fresh = make_sampler(Qwen2(cfg, rngs=nnx.Rngs(0)), num_slots=8, max_prompt_len=8,
                       max_len=40, steps_per_call=4).sample_groups(prompts, **kw)
  assert not np.array_equal(out.tokens, fresh.tokens)  # the new weights drew the later tokens
  np.testing.assert_array_equal(out.tokens[..., :4], fresh.tokens[..., :4])


def test_no_group_lost_or_trained_twice(tmp_path, monkeypatch):
  """Every mixed group sampled is trained exactly once, discarded as surplus (counted), or
  still waiting in the pipeline when the run ends; no prompt is trained by two steps."""
  generated, trained, pipes = [], [], []
  gen, take = rounds.generate_round, pipeline_lib.Pipeline.take

  def record_round(*a, **kw):
    g = gen(*a, **kw)
    generated.extend(tuple(p) for p, m in zip(g.prompts, filtering.mixed_groups(g.correct)) if m)
    return g

  def record_take(self, run):
    c = take(self, run)
    pipes.append(self)  # the loop's own Pipeline (a local of trainer.train)
    trained.append((c.summary["surplus_discarded"], [tuple(p) for p in c.groups.prompts]))
    return c

  monkeypatch.setattr(rounds, "generate_round", record_round)
  monkeypatch.setattr(pipeline_lib.Pipeline, "take", record_take)
  cfg = tiny_config(**dict(ASYNC, **{"train.num_steps": 4, "algo.gen_batch_size": 6}))
  _train(cfg, tmp_path)
  flat = [p for _, batch in trained for p in batch]
  assert len(flat) == len(set(flat)) == 4 * cfg.train.batch_size
  pipe = pipes[-1]
  assert all(p is pipe for p in pipes)
  waiting = [tuple(p) for b in pipe.buffer for p in b.groups.prompts]
  if pipe.filling is not None:
    waiting += [tuple(p) for h in pipe.filling.filler.held for p in h.prompts]
  surplus = sum(s for s, _ in trained) + sum(b.summary["surplus_discarded"] for b in pipe.buffer)
  assert len(generated) == len(flat) + len(waiting) + surplus
  assert set(flat + waiting) <= set(generated) and not set(flat) & set(waiting)


def test_is_correction_weighs_the_sampled_behaviour_logprobs(tmp_path, monkeypatch):
  """The update's IS correction compares the trainer's recomputed log-probs with the ones the
  sampler drew each token with (several policy versions within one batch)."""
  seen = []
  prepare = trainer.prepare

  def record(run, groups, **kw):
    seen.append((groups, prepare(run, groups, **kw)))
    return seen[-1][1]

  monkeypatch.setattr(trainer, "prepare", record)
  _slow_update(monkeypatch)
  recs = _train(tiny_config(**dict(ASYNC, **{"train.num_steps": 3})), tmp_path)
  groups, prep = seen[-1]
  n, g, r = groups.behav_logp.shape
  resp = prep.resp_mask_BxS
  np.testing.assert_array_equal(prep.batch.behav_logp_BxS[resp],
                                groups.behav_logp[np.arange(r)[None, None] <
                                                  groups.lengths[..., None]])
  assert not np.allclose(prep.batch.old_logp_BxS[resp], prep.batch.behav_logp_BxS[resp])
  diff = np.abs(prep.batch.old_logp_BxS - prep.batch.behav_logp_BxS)[resp].mean()
  assert recs[-1]["is_logp_diff_abs_mean"] == pytest.approx(diff, rel=1e-4)
  assert recs[-1]["staleness_max"] == 1.0 and recs[-1]["mismatch_k3"] > 0


def test_split_rollout_and_update_overlap(tmp_path):
  """Sampler and trainer on their own devices: on every step after the first the sampler's
  rollout and the update run at the same time (their wall-clock spans add up to more than
  the step's)."""
  cfg = tiny_config(**dict(ASYNC, **{
      "rollout.placement": "split", "rollout.sampler_devices": 4.0, "train.num_steps": 4,
      "train.num_minibatches": 4, "rollout.max_new_tokens": 24, "train.batch_size": 8,
      "algo.gen_batch_size": 8, "rollout.num_slots": 32}))
  run = trainer.build(cfg, str(tmp_path), resume=False)
  assert len(run.mesh.devices.flat) == 4 and run.placement.split
  assert not set(run.mesh.devices.flat) & set(run.sampler.engine.mesh.devices.flat)
  trainer.train(run, resume=False)
  for r in _raw_records(tmp_path)[1:]:
    assert r["time_rollout_s"] + r["time_update_s"] > r["time_step_s"], r


@pytest.mark.parametrize("over, msg", [
    ({"rollout.max_staleness": -1}, "rollout.max_staleness: must be >= 0"),
    ({"rollout.partial": True}, "rollout.partial: needs rollout.max_staleness >= 1"),
    ({"rollout.max_staleness": 1, "rollout.partial": True},
     "rollout.partial: needs the behaviour log-probs"),
    ({"rollout.placement": "split"}, "rollout.sampler_devices: with placement='split'"),
    ({"rollout.sampler_devices": 2.0}, "only used with rollout.placement='split'"),
    ({"rollout.placement": "split", "rollout.sampler_devices": 2.5}, "a device count >= 1"),
    ({"rollout.placement": "elsewhere"}, "rollout.placement: must be one of"),
    ({"rollout.max_staleness": 1, "algo.prefilter": True}, "algo.prefilter: is not supported"),
])
def test_impossible_settings_are_refused_at_parse(over, msg):
  with pytest.raises(ValueError, match=msg):
    tiny_config(**over)


@pytest.mark.parametrize("devices, msg", [
    (8.0, "gives the sampler 8 of 8 devices"), (0.01, "gives the sampler 0 of 8 devices"),
    (6.0, "num_slots: 16 concurrent sequences must split")])
def test_split_without_room_for_both_roles_is_refused_before_compile(tmp_path, devices, msg):
  cfg = tiny_config(**{"rollout.placement": "split", "rollout.sampler_devices": devices})
  with pytest.raises(ValueError, match=msg):
    trainer.build(cfg, str(tmp_path), resume=False)


def test_split_that_cannot_hold_the_kv_pool_is_refused(tmp_path):
  cfg = tiny_config(**{"rollout.placement": "split", "rollout.sampler_devices": 4.0,
                       "rollout.kv_cache_gib": 1e-7})
  with pytest.raises(ValueError, match="kv_cache_gib"):
    trainer.build(cfg, str(tmp_path), resume=False)
