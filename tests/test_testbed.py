"""The ablation testbed (data/testbed.py, configs/testbed_cpu.py): its demonstrations, its
difficulty mix, its config checks, and the shipped base measured on what each knob claims."""
import collections
import importlib
import os
import random
import sys

import numpy as np
import pytest

from dapo_jax import config as config_lib
from dapo_jax.data import synthetic, testbed
from dapo_jax.data import tokenizer as tokenizer_lib
from dapo_jax.rewards import reflection
from dapo_jax.train import sft

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KNOBS = dict(error_rate=0.0, recheck_rate=0.0, loop_rate=0.0, spacing=0.0)


def _demos(n=400, **knobs):
  ex = synthetic.SyntheticTask(2, seed=0, difficulty_max=5).examples("train", n)
  rng = random.Random(0)
  return ex, [testbed.demo_response(e, rng=rng, **{**KNOBS, **knobs}) for e in ex]


def test_difficulty_mix_gives_equal_shares_and_keeps_the_old_streams():
  ex = synthetic.SyntheticTask(2, seed=0, difficulty_max=5).examples("heldout", 256)
  counts = collections.Counter(len(synthetic.parse_problem(e.problem)[1]) for e in ex)
  assert counts == {2: 64, 3: 64, 4: 64, 5: 64}
  fixed = synthetic.SyntheticTask(3, seed=0)  # difficulty_max=0: the problems of before
  assert fixed.examples("train", 5) == synthetic.SyntheticTask(3, 0, difficulty_max=0).examples(
      "train", 5)
  assert all(len(synthetic.parse_problem(e.problem)[1]) == 3 for e in fixed.examples("train", 50))
  with pytest.raises(ValueError, match="difficulty_max: 2 is below difficulty 3"):
    synthetic.SyntheticTask(3, difficulty_max=2)


def test_demonstrations_with_every_knob_off_are_the_references():
  ex, demos = _demos(50)
  assert demos == [e.solution for e in ex]
  assert testbed.demo_fn(KNOBS) is None


def test_each_knob_changes_what_it_claims():
  ex, base = _demos()
  tok = tokenizer_lib.load_tokenizer()
  length = lambda texts: np.mean([len(tok.encode(t, add_special_tokens=False)) for t in texts])  # noqa: E731
  acc = lambda texts: np.mean([synthetic.score(t, e)[1] for t, e in zip(texts, ex)])  # noqa: E731
  _, slips = _demos(error_rate=0.3)
  assert acc(base) == 1.0 and acc(slips) < 0.5          # slips reach the answer
  _, fixed = _demos(error_rate=0.3, recheck_rate=1.0)
  assert acc(fixed) == 1.0 and length(fixed) > 1.8 * length(base)  # re-checks correct them
  assert all(testbed.RECHECK in t for t in fixed)
  _, loops = _demos(loop_rate=0.1)
  looped = [t for t in loops if "Answer:" not in t]
  assert 0.15 < len(looped) / len(ex) < 0.5           # ~1 - 0.9^3.5 of the demonstrations
  assert min(len(tok.encode(t)) for t in looped) > 64  # past the testbed's generation limit
  _, spaced = _demos(spacing=0.5)
  assert acc(spaced) == 1.0 and 1.1 * length(base) < length(spaced) < 1.6 * length(base)
  assert len(set(spaced)) > len(set(base)) - 1 and spaced != base


def test_recheck_lines_are_what_the_reflection_tracker_counts():
  ex, demos = _demos(100, error_rate=0.3, recheck_rate=0.5)
  pattern = reflection.phrase_pattern(reflection.parse_phrases("check"))
  assert all((pattern.search(t) is not None) == (testbed.RECHECK in t) for t in demos)


def test_demonstrations_are_cut_at_the_limit_references_are_not():
  tok = tokenizer_lib.load_tokenizer()
  ex, loops = _demos(20, loop_rate=1.0)
  rows = sft.sequences(ex, tok, seq_len=100, eos_id=tok.eos_token_id, responses=loops)
  assert rows["attn_mask"].sum(1).tolist() == [100] * len(ex)   # cut, no EOS
  assert (rows["tokens"][:, -1] != tok.eos_token_id).all()
  with pytest.raises(ValueError, match="needs"):
    sft.sequences(ex[:1], tok, seq_len=40, eos_id=tok.eos_token_id)


@pytest.mark.parametrize("section, field, value, msg", [
    ("task", "difficulty_max", 1, r"task.difficulty_max: must be 0 or in \[difficulty=2"),
    ("warm_start", "spacing", 1.5, r"warm_start.spacing: must be a probability"),
    ("warm_start", "loop_rate", -0.1, r"warm_start.loop_rate: must be a probability"),
])
def test_testbed_config_rejects_bad_knobs(section, field, value, msg):
  c = importlib.import_module("configs.testbed_cpu").get_config()
  c[section][field] = value
  with pytest.raises(ValueError, match=msg):
    config_lib.parse(c)


def test_demonstrations_and_difficulty_mix_need_the_synthetic_task():
  c = importlib.import_module("configs.testbed_cpu").get_config()
  c.task.name, c.task.eval_name = "arith_nl", "arith_nl_heldout"
  with pytest.raises(ValueError, match="task.difficulty_max: only the synthetic task"):
    config_lib.parse(c)
  c.task.difficulty_max = 0
  with pytest.raises(ValueError, match="warm_start: demonstrations .* synthetic task only"):
    config_lib.parse(c)


def test_shipped_testbed_base_gives_each_technique_something_to_act_on():
  """Measured on the shipped base (two sampled batches, no update), against the tiny base."""
  sys.path.insert(0, REPO)
  stats = importlib.import_module("experiments.testbed_stats")
  testbed_c = importlib.import_module("configs.testbed_cpu").get_config()
  tiny_c = importlib.import_module("configs.tiny_cpu").get_config()
  rows = {}
  for name, c in (("testbed", testbed_c), ("tiny", tiny_c)):
    c.log.progress = c.log.tensorboard = False
    c.algo.dynamic_sampling = False
    rows[name] = stats.measure(c, num_rounds=2)
  t, tiny = rows["testbed"], rows["tiny"]
  assert 0.05 <= t["truncated"] <= 0.45 and tiny["truncated"] < 0.02     # overlong shaping
  assert t["entropy"] > 2 * tiny["entropy"] and t["entropy"] > 0.3       # Clip-Higher
  assert t["groups_all_correct"] + t["groups_all_wrong"] > 0.03        # dynamic sampling
  assert t["acc_by_difficulty"][2] > 3 * t["acc_by_difficulty"][5]      # the mix
  assert t["recheck_share"] > 0.1 and tiny["recheck_share"] == 0.0      # re-check lines


def test_short_testbed_run_trains_on_what_the_knobs_made(tmp_path):
  """Three rollout steps of the testbed (runlocal): dynamic sampling has uniform groups to drop,
  responses are truncated, the re-check tracker reads the base's re-check lines."""
  import json  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import trainer  # pylint: disable=g-import-not-at-top
  c = importlib.import_module("configs.testbed_cpu").get_config("runlocal=True")
  c.train.num_steps = 3
  c.log.progress = c.log.tensorboard = False
  c.checkpoint.every_steps = 0
  run = trainer.build(config_lib.parse(c), str(tmp_path), resume=False)
  out = trainer.train(run, resume=False)
  assert out["steps"] == 3
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    recs = [r for r in map(json.loads, f) if r["kind"] == "train"]
  mean = lambda k: np.mean([r[k] for r in recs])  # noqa: E731
  assert mean("truncated_frac") > 0.03 and mean("entropy") > 0.3
  assert mean("frac_groups_acc_0") + mean("frac_groups_acc_1") > 0.1
  assert mean("accepted_frac") < 0.9                   # dynamic sampling dropped groups
  assert mean("reflect_frac") > 0.1                    # log.reflection_phrases = "check"
