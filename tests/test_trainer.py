"""End-to-end trainer on a tiny model: the loop runs, resumes bitwise, and guards its inputs."""
import dataclasses
import hashlib
import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from configs import tiny_cpu
from dapo_jax import config as config_lib
from dapo_jax import rewards
from dapo_jax.rollout.sampler import GroupSampler
from dapo_jax.train import dynamic_sampling, trainer

TIME_KEYS = ("time_", "tokens_per_s", "wall")


def _hash_reward(text, ground_truth):
  """A fake verifier: 'correct' for a pseudo-random half of the responses (mixed groups)."""
  del ground_truth
  ok = hashlib.sha256(text.encode()).digest()[0] % 2 == 0
  return (1.0 if ok else -1.0), ok, None


def _never_reward(text, ground_truth):
  del text, ground_truth
  return -1.0, False, None


@pytest.fixture(autouse=True)
def fake_rewards(monkeypatch):
  monkeypatch.setitem(rewards.REWARD_FNS, "hash", _hash_reward)
  monkeypatch.setitem(rewards.REWARD_FNS, "never", _never_reward)


def tiny_dict(**overrides):
  """A seconds-fast ConfigDict: 1-layer model, G=4, 4 prompts, 8 new tokens, fake verifier."""
  c = tiny_cpu.get_config("init=True")
  c.model.update(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                 num_kv_heads=1, head_dim=16)
  c.task.update(num_train=200, reward="hash")
  c.rollout.update(group_size=4, max_new_tokens=8, num_slots=16)
  c.algo.update(gen_batch_size=4, max_gen_rounds=4, overlong_cache_len=2)
  c.train.update(num_steps=2, batch_size=4, num_minibatches=2)
  c.eval.update(num_problems=4, num_samples=2, bootstrap_samples=10)
  c.mesh.update(data=-1)
  c.log.update(tensorboard=False, progress=False)
  c.checkpoint.update(async_save=False, export_hf=False)
  for path, v in overrides.items():
    section, key = path.split(".")
    c[section][key] = v
  return c


def tiny_config(**overrides):
  return config_lib.parse(tiny_dict(**overrides))


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    recs = [json.loads(line) for line in f]
  return [{k: v for k, v in r.items() if not k.startswith(TIME_KEYS)} for r in recs
          if r["kind"] == "train"]


def _run(cfg, workdir, resume=False):
  run = trainer.build(cfg, str(workdir), resume=resume)
  out = trainer.train(run, resume=resume)
  return run, out


def test_loop_runs_and_logs_every_metric(tmp_path):
  run, out = _run(tiny_config(), tmp_path)
  assert out["steps"] == 2 and "before" in out and "after" in out
  recs = _records(tmp_path)
  assert [r["step"] for r in recs] == [1, 2]
  for key in ("reward_mean", "accuracy", "response_length_mean", "response_length_max",
              "response_length_p90", "truncated_frac", "entropy", "mean_token_prob",
              "frac_groups_acc_1", "frac_groups_acc_0", "gen_rounds", "prompts_sampled",
              "accepted_frac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual",
              "upclip_prob_mean", "approx_kl", "grad_norm", "lr", "tokens_generated",
              "sampler_preemptions", "sampler_pool_peak_frac"):
    assert key in recs[0], key
  assert recs[0]["sampler_preemptions"] == 0  # the default pool: every slot at full length
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    raw = [json.loads(line) for line in f]
  assert all(k in raw[1] for k in ("time_rollout_s", "time_prepare_s", "time_update_s",
                                   "time_sync_s", "tokens_per_s"))
  assert int(run.loop.state.updates) == 4  # 2 steps x 2 mini-batches


def test_resume_is_bitwise_identical(tmp_path):
  # At this lr the rollouts depend on the weights (tests/test_trainer_wiring.py), so a resume
  # that restored the trainer but not the sampler's weights would diverge here.
  fast = {"optim.lr": 3e-2, "optim.warmup_steps": 0}
  cfg4 = tiny_config(**{"train.num_steps": 4, "checkpoint.every_steps": 2, **fast})
  full, _ = _run(cfg4, tmp_path / "full")
  cfg2 = tiny_config(**{"train.num_steps": 2, "checkpoint.every_steps": 2, **fast})
  _run(cfg2, tmp_path / "split")
  resumed, _ = _run(cfg4, tmp_path / "split", resume=True)
  assert _records(tmp_path / "full") == _records(tmp_path / "split")
  for a, b in zip(jax.tree.leaves(full.loop.state), jax.tree.leaves(resumed.loop.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_step_metrics_count_the_sampler_preemptions(tmp_path, monkeypatch):
  """A pool of 21 pages of 4 tokens per batch shard (one 80-token sequence is 20, plus the null
  page) under 2 rows of a 68-token prompt growing 2 tokens a call: rows are preempted, and each
  step logs the sum of its generation rounds' preemptions and their fullest shard (evals,
  G = eval.num_samples = 2, are not counted)."""
  rounds = []
  sample = GroupSampler.sample_groups

  def spy(self, *args, **kw):
    out = sample(self, *args, **kw)
    if kw["group_size"] == 4:  # a training round, not an eval
      rounds.append((out.stats["preemptions"], out.stats["pool_peak_frac"]))
    return out
  monkeypatch.setattr(GroupSampler, "sample_groups", spy)
  per_page = 2 * 1 * 4 * 1 * 16 * 4  # K and V x layers x tokens x KV heads x head_dim x f32
  _run(tiny_config(**{"rollout.page_size": 4, "rollout.steps_per_call": 2,
                      "rollout.kv_cache_gib": 21 * per_page / 2**30}), tmp_path)
  recs = _records(tmp_path)
  it = iter(rounds)
  for r in recs:
    step = [next(it) for _ in range(int(r["gen_rounds"]))]
    assert r["sampler_preemptions"] == sum(p for p, _ in step) > 0
    assert r["sampler_pool_peak_frac"] == max(f for _, f in step) == 1.0  # a shard ran full
  assert next(it, None) is None


def test_uniform_groups_stop_with_dynamic_sampling_error(tmp_path):
  with pytest.raises(dynamic_sampling.DynamicSamplingError, match="after 4 rounds"):
    _run(tiny_config(**{"task.reward": "never"}), tmp_path)


def test_bad_configs_fail_before_compilation(tmp_path):
  with pytest.raises(ValueError, match="num_minibatches"):
    tiny_config(**{"train.num_minibatches": 3})
  with pytest.raises(ValueError, match="group_size"):
    tiny_config(**{"rollout.group_size": 1})
  with pytest.raises(ValueError, match="config.mesh"):
    trainer.build(tiny_config(**{"mesh.data": 3}), str(tmp_path), resume=False)


def test_nan_steps_are_skipped_then_stop_the_run(tmp_path, monkeypatch):
  real = trainer.groups_lib.training_batch

  def poisoned(*a, **kw):
    out, resp = real(*a, **kw)
    return dataclasses.replace(out, adv_B=np.full_like(out.adv_B, np.nan)), resp

  monkeypatch.setattr(trainer.groups_lib, "training_batch", poisoned)
  cfg = tiny_config(**{"train.num_steps": 5, "train.max_bad_steps": 2})
  run = trainer.build(cfg, str(tmp_path), resume=False)
  before = jax.tree.map(np.asarray, nnx.to_pure_dict(run.loop.state.params))
  with pytest.raises(trainer.TooManyBadSteps, match="2 consecutive"):
    trainer.train(run, resume=False)
  after = jax.tree.map(np.asarray, nnx.to_pure_dict(run.loop.state.params))
  jax.tree.map(np.testing.assert_array_equal, before, after)
  assert [r["updates_skipped"] for r in _records(tmp_path)] == [2.0, 2.0]



# A large lr makes ratios move within the step; 24 new tokens let some samples end (EOS).
FLIP = {"optim.lr": 3e-2, "optim.warmup_steps": 0, "algo.max_gen_rounds": 8,
        "rollout.max_new_tokens": 24, "algo.overlong_cache_len": 4}


def _one_step(c, workdir):
  run = trainer.build(config_lib.parse(c), str(workdir), resume=False)
  return trainer.rollout_step(run, trainer.jitted_update(run))


def test_each_ladder_switch_changes_the_run(tmp_path):
  """Walks the Table-1 rungs on a tiny run (same seed, so the same rollouts); each switch must
  show in the step's metrics."""
  from configs import ladder  # pylint: disable=import-outside-toplevel
  m = {}
  for rung in ladder.RUNGS:
    c = ladder.apply_rung(tiny_dict(**FLIP), rung)
    m[rung] = _one_step(c, tmp_path / rung)
  # Overlong filtering: truncated responses (most, at 24 new tokens) leave the loss.
  assert 0 < m["naive_grpo"]["truncated_frac"] < 1
  assert m["overlong_filter"]["num_tokens"] < m["naive_grpo"]["num_tokens"]
  # Soft overlong punishment: truncated responses are penalised (-1 at the limit).
  assert m["soft_overlong"]["reward_mean"] < m["clip_higher"]["reward_mean"]
  # Token-level loss: another aggregation of the same per-token losses.
  assert m["token_level"]["pg_loss"] != pytest.approx(m["soft_overlong"]["pg_loss"], rel=1e-6)
  # Dynamic sampling: rounds of gen_batch_size prompts with only mixed groups kept.
  assert m["token_level"]["gen_rounds"] == 1 and m["token_level"]["accepted_frac"] == 1.0
  assert m["dapo"]["prompts_sampled"] % 4 == 0 and m["dapo"]["accepted_frac"] < 1.0
  # Clip-higher (eps_high 0.2 -> 0.28), on a rung whose loss sees tokens.
  c = ladder.apply_rung(tiny_dict(**FLIP), "token_level")
  c.algo.eps_high = 0.2
  low = _one_step(c, tmp_path / "eps020")
  assert low["clipfrac_upper"] > 0
  assert low["clipfrac_upper"] >= m["token_level"]["clipfrac_upper"]
  assert low["pg_loss"] != pytest.approx(m["token_level"]["pg_loss"], rel=1e-6)
