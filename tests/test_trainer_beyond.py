"""Trainer wiring of the switches beyond the paper: adaptive Eq. 13 ramp, reflection tracker,
pre-filter."""
import dataclasses
import math
import types

import numpy as np
import pytest

from dapo_jax import rewards
from dapo_jax.core import overlong
from dapo_jax.rewards import reflection
from dapo_jax.train import collector, prefilter, recovery, rounds, trainer
from tests.test_trainer import fake_rewards, tiny_config  # noqa: F401  (autouse fixture)


def _same(a: dict, b: dict):
  assert a.keys() == b.keys()
  for k in a:
    assert a[k] == b[k] or (math.isnan(a[k]) and math.isnan(b[k])), k


def test_adaptive_ramp_and_reflection_reach_the_step(tmp_path):
  phrases = "answer,a,b,c,d,e"
  run = trainer.build(tiny_config(**{"algo.overlong_adaptive": True, "algo.prefilter": True,
                                     "log.reflection_phrases": phrases}), str(tmp_path),
                      resume=False)
  a, max_len = run.cfg.algo, run.cfg.rollout.max_new_tokens
  batch0, summary0 = collector.collect(run)
  assert summary0["overlong_cache_len"] == a.overlong_cache_len  # no history yet: the fixed one
  step0 = np.concatenate([x.ravel() for x in run.loop.length_history[0]])
  assert step0.size == summary0["prompts_sampled"] * run.cfg.rollout.group_size  # every round
  assert summary0["prefilter_records"] == len(run.prefilter.records) > 0
  assert summary0["prefilter_skipped"] == 0  # nothing seen twice yet
  _same({k: summary0[k] for k in reflection.batch_metrics([], [], [], phrases=("a",),
                                                          reward_fn=None)},
        reflection.groups_metrics(batch0, decode=run.task.decode,
                                  phrases=reflection.parse_phrases(phrases),
                                  reward_fn=rewards.get_reward_fn(run.cfg.task.reward)))
  # Pick a percentile whose ramp differs from the fixed L_cache, so the test can see it used.
  want = {p: max_len - int(np.percentile(step0, p, method="higher")) for p in (0, 50, 100)}
  p = next((p for p, c in want.items() if c != a.overlong_cache_len), None)
  assert p is not None, f"every percentile gives the fixed L_cache: {want}"
  run = dataclasses.replace(run, cfg=dataclasses.replace(run.cfg, algo=dataclasses.replace(
      a, overlong_adaptive_percentile=float(p))))
  run.loop.step = 1
  batch1, summary1 = collector.collect(run)
  assert summary1["overlong_cache_len"] == want[p]
  penalty = overlong.soft_overlong_penalty(batch1.lengths, max_len=max_len, cache_len=want[p],
                                           factor=a.overlong_factor)
  np.testing.assert_allclose(batch1.reward - batch1.score, penalty, atol=1e-6)


def test_prefilter_drops_recorded_prompts_and_records_survive_a_restart(tmp_path):
  run = trainer.build(tiny_config(**{"algo.prefilter": True, "algo.prefilter_min_seen": 1,
                                     "algo.prefilter_revisit": 0.0,
                                     "algo.overlong_adaptive": True}),
                      str(tmp_path), resume=False)
  state = run.data.state()
  upcoming = next(run.data).prompt_ids
  run.data.restore(state)
  skip = [prefilter.prompt_key(p) for p in upcoming[1::2]]
  run.prefilter.records = {k: prefilter.Record(1, 4.0, 4.0, 0) for k in skip}
  g = rounds.generate_round(run, 0, len(upcoming))
  assert g.prompts == upcoming[0::2]
  assert all(run.prefilter.records[prefilter.prompt_key(p)].seen == 1 for p in g.prompts)
  assert all(run.prefilter.records[k] == prefilter.Record(1, 4.0, 4.0, 0) for k in skip)
  meta = trainer._meta(run, None)  # pylint: disable=protected-access
  meta |= {"results": {}, "metrics_records": 0}
  saved, lengths = dict(run.prefilter.records), run.loop.length_history[0][0]
  run.prefilter.records, run.loop.length_history = {}, {}
  ckpt = types.SimpleNamespace(restore_latest=lambda s: (run.loop.step, s, meta), directory="ckpt",
                               latest_step=lambda: run.loop.step, meta=lambda step: meta)
  recovery.start(run, ckpt, resume=True)
  assert run.prefilter.records == saved
  np.testing.assert_array_equal(run.loop.length_history[0][0], lengths)  # the adaptive ramp's too


def test_prefilter_needs_dynamic_sampling():
  with pytest.raises(ValueError, match="config.algo.prefilter: needs algo.dynamic_sampling"):
    tiny_config(**{"algo.prefilter": True, "algo.dynamic_sampling": False})
