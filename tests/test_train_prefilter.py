"""train/prefilter: hand-computed records, skip rule, seeded re-visits, batch selection, state."""
import types

import numpy as np
import pytest

from dapo_jax.data.pipeline import PromptBatch
from dapo_jax.train import prefilter

KW = dict(seed=0, decay=0.5, min_seen=2, margin=0.0, revisit=0.0)


def test_observe_hand_computed_and_pure():
  r0 = {}
  r1 = prefilter.observe(r0, ["a", "b"], [[1, 1, 1, 1], [1, 0, 0, 0]], step=3, decay=0.5)
  assert r0 == {}
  assert r1["a"] == prefilter.Record(1, 4.0, 4.0, 3) and r1["b"].pass_rate == 0.25
  r2 = prefilter.observe(r1, ["a"], [[1, 1, 0, 0]], step=5, decay=0.5)
  assert r2["a"] == prefilter.Record(2, 0.5 * 4 + 4, 0.5 * 4 + 2, 5)  # rate 4 / 6
  assert r2["b"] is r1["b"]
  with pytest.raises(ValueError, match="correct_NxG"):
    prefilter.observe({}, ["a"], [1, 1], step=0, decay=0.5)


def test_skip_rule():
  all_right = prefilter.Record(2, 6.0, 6.0, 0)
  assert prefilter.skippable(all_right, min_seen=2, margin=0.0)
  assert not prefilter.skippable(all_right, min_seen=3, margin=0.0)  # not seen often enough
  assert prefilter.skippable(prefilter.Record(2, 6.0, 0.0, 0), min_seen=2, margin=0.0)
  nearly = prefilter.Record(4, 10.0, 9.5, 0)
  assert not prefilter.skippable(nearly, min_seen=2, margin=0.0)
  assert prefilter.skippable(nearly, min_seen=2, margin=0.05)
  assert not prefilter.skippable(None, min_seen=1, margin=0.4)


def _uniform_records(keys):
  return {k: prefilter.Record(3, 8.0, 8.0, 0) for k in keys}


def test_revisits_are_seeded_and_about_the_configured_share():
  keys = [f"k{i}" for i in range(4000)]
  masks = []
  for seed, step in ((0, 1), (0, 1), (1, 1), (0, 2)):
    pf = prefilter.Prefilter(**{**KW, "seed": seed, "revisit": 0.1})
    pf.records = _uniform_records(keys)
    masks.append(pf.keep_mask(keys, step=step))
  np.testing.assert_array_equal(masks[0], masks[1])  # same seed and step: same draws
  assert (masks[0] != masks[2]).any() and (masks[0] != masks[3]).any()
  assert 0.08 < masks[0].mean() < 0.12
  # Order does not matter: each key's draw depends on (seed, step, key) only.
  pf = prefilter.Prefilter(**{**KW, "revisit": 0.1})
  pf.records = _uniform_records(keys)
  np.testing.assert_array_equal(pf.keep_mask(keys[::-1], step=1), masks[0][::-1])


def _batch(prompts):
  n = len(prompts)
  examples = [types.SimpleNamespace(id=str(i), answer=str(i)) for i in range(n)]
  return PromptBatch(step=0, epoch=0, examples=examples, prompt_ids=prompts,
                     lengths_B=np.array([len(p) for p in prompts], np.int32),
                     truncated_B=np.arange(n) % 2 == 0)


def test_select_observe_counters_and_state():
  prompts = [[1, 2], [3], [4, 5, 6], [7]]
  pf = prefilter.Prefilter(**KW)
  keys = [prefilter.prompt_key(p) for p in prompts]
  pf.records = _uniform_records([keys[1], keys[2]])
  kept = pf.select(_batch(prompts), step=4)
  assert kept.prompt_ids == [[1, 2], [7]] and kept.ids == ["0", "3"]
  np.testing.assert_array_equal(kept.lengths_B, [2, 1])
  np.testing.assert_array_equal(kept.truncated_B, [True, False])
  groups = types.SimpleNamespace(prompts=kept.prompt_ids, correct=np.array([[1, 0], [1, 1]]))
  pf.observe(groups, step=4)
  assert pf.records[keys[0]] == prefilter.Record(1, 2.0, 1.0, 4)
  assert pf.step_metrics() == {"prefilter_skipped": 2, "prefilter_revisited": 0,
                               "prefilter_records": 4}
  assert pf.step_metrics()["prefilter_skipped"] == 0  # reset each step
  again = prefilter.Prefilter(**KW)
  again.restore(pf.state())
  assert again.records == pf.records
  with pytest.raises(ValueError, match=r"^checkpoint: no pre-filter records \(saved with "):
    again.restore(None)


def test_prompt_key_is_the_token_ids_not_their_container():
  """A prompt's record is found whatever integer array type carries its ids (the sampler's
  int32 rows, Python lists from the data readers)."""
  ids = [151644, 872, 198, 7]
  key = prefilter.prompt_key(ids)
  assert key == prefilter.prompt_key(np.asarray(ids, np.int32))
  assert key == prefilter.prompt_key(np.asarray(ids, np.uint32))
  assert key != prefilter.prompt_key(ids[:-1]) and len(key) == 20


def test_a_round_never_samples_nothing():
  prompts = [[1], [2], [3]]
  pf = prefilter.Prefilter(**KW)
  pf.records = _uniform_records([prefilter.prompt_key(p) for p in prompts])
  assert pf.select(_batch(prompts), step=0).prompt_ids == [[1]]


def test_from_config():
  algo = types.SimpleNamespace(prefilter=True, prefilter_decay=0.8, prefilter_min_seen=2,
                               prefilter_margin=0.0, prefilter_revisit=0.1)
  pf = prefilter.from_config(algo, seed=3, num_processes=1)
  assert (pf.seed, pf.decay, pf.revisit) == (3, 0.8, 0.1)
  off = types.SimpleNamespace(prefilter=False)
  assert prefilter.from_config(off, seed=3, num_processes=2) is None
  with pytest.raises(ValueError, match="config.algo.prefilter: runs on one process"):
    prefilter.from_config(algo, seed=3, num_processes=2)
