"""Accuracy per difficulty level: the level read from a prompt's text, the per-step tally, and
its wiring into the trainer's step metrics."""
import numpy as np
import pytest

from dapo_jax.data import synthetic, template
from dapo_jax.train import collector, dynamic_sampling, levels, trainer
from tests.test_train_dynamic_sampling import _groups
from tests.test_trainer import _records, fake_rewards, tiny_config  # noqa: F401  (autouse)


def test_level_of_reads_the_operations_of_the_problem_in_a_prompt():
  assert synthetic.level_of("Compute 3+8-5.") == 2
  assert synthetic.level_of(template.make_prompt("Compute 12-3+40-7+1.")) == 4
  assert synthetic.level_of("Compute 7+1.") == 1
  assert synthetic.level_of("How many marbles does Zoe have?") is None
  for e in synthetic.SyntheticTask(2, seed=0, difficulty_max=5).examples("train", 8):
    assert synthetic.level_of(e.prompt) == len(synthetic.parse_problem(e.problem)[1])


def test_tally_counts_each_level_over_every_round():
  texts = {1: "Compute 1+2.", 2: "Compute 1+2+3.", 3: "Compute 1+2.", 4: "no problem"}
  decode = lambda prompts: [texts[p[-1] - 1] for p in prompts]  # _groups' prompts: [1, 2 + n]
  tally = levels.LevelTally(decode)
  rounds = [_groups([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]]),
            _groups([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])]
  gen = tally.wrap(lambda r, n: rounds[r])
  batch, summary, _ = dynamic_sampling.fill_batch(gen, batch_size=2, gen_batch_size=4,
                                                  max_gen_rounds=4, dynamic=True)
  assert len(batch) == 2 and summary["gen_rounds"] == 1  # round 0 holds 2 mixed groups
  m = tally.metrics()
  # round 0 only: level 1 = prompts 0 and 2 (rows 1111, 0000); level 2 = prompt 1 (1000);
  # prompt 3 has no level and is not counted
  assert m == {"gen_accuracy_level1": 0.5, "frac_groups_acc_1_level1": 0.5,
               "frac_groups_acc_0_level1": 0.5, "gen_groups_level1": 2,
               "gen_accuracy_level2": 0.25, "frac_groups_acc_1_level2": 0.0,
               "frac_groups_acc_0_level2": 0.0, "gen_groups_level2": 1}
  tally.wrap(lambda r, n: rounds[1])(1, 4)  # a second round adds to the same step's counts
  assert tally.metrics()["gen_groups_level1"] == 4
  # level 1 rows now 1111, 0000 (round 0) and 1111, 1111 (round 1): 12 of 16 correct
  assert tally.metrics()["gen_accuracy_level1"] == pytest.approx(0.75)


def test_tasks_without_a_level_mix_log_nothing():
  cfg = tiny_config()  # the synthetic task at one difficulty
  tally = levels.for_run(cfg, decode=lambda p: pytest.fail("decoded without a mix"))
  generate = lambda r, n: None
  assert tally.wrap(generate) is generate and tally.metrics() == {}


def test_trainer_logs_accuracy_per_level(tmp_path):
  cfg = tiny_config(**{"task.difficulty": 2, "task.difficulty_max": 3, "train.num_steps": 1})
  run = trainer.build(cfg, str(tmp_path), resume=False)
  _, summary = collector.collect(run)
  n2, n3 = summary["gen_groups_level2"], summary["gen_groups_level3"]
  assert n2 + n3 == summary["prompts_sampled"] and n2 > 0 and n3 > 0
  # the levels partition every generated response: their weighted accuracy is gen_accuracy
  both = (n2 * summary["gen_accuracy_level2"] + n3 * summary["gen_accuracy_level3"]) / (n2 + n3)
  assert both == pytest.approx(summary["gen_accuracy"])
  assert 0.0 <= summary["frac_groups_acc_1_level2"] <= 1.0
  assert not np.isnan(summary["frac_groups_acc_0_level3"])



def test_pipelined_loop_logs_levels_too(tmp_path):
  """The asynchronous loop's batches carry the per-level tally: the levels partition the
  step's generated groups (the wiring in pipeline.Pipeline, not only in collector.collect)."""
  cfg = tiny_config(**{"task.difficulty": 2, "task.difficulty_max": 3, "train.num_steps": 1})
  run = trainer.build(cfg, str(tmp_path), resume=False)
  trainer.train(run, resume=False, pipelined=True)
  (rec,) = _records(tmp_path)
  n2, n3 = rec["gen_groups_level2"], rec["gen_groups_level3"]
  assert n2 + n3 == rec["prompts_sampled"] and n2 > 0 and n3 > 0
  both = (n2 * rec["gen_accuracy_level2"] + n3 * rec["gen_accuracy_level3"]) / (n2 + n3)
  assert both == pytest.approx(rec["gen_accuracy"])
