"""experiments/base_rate.py: config overrides and the table row (the measurement itself runs a
model; it is what experiments/results/smollm2/base_rate.json holds)."""
import importlib.util
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("base_rate", REPO / "experiments" / "base_rate.py")
base_rate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(base_rate)
CONFIG = str(REPO / "configs" / "smollm2_cpu.py")


def test_overrides_and_difficulty_reach_the_config():
  cfg = base_rate._load_config(CONFIG, 2, ["task.eval_name=math_500_easy",
                                           "eval.num_problems=0", "model.hf_path=/x/y"])
  assert (cfg.task.difficulty, cfg.task.eval_name, cfg.eval.num_problems) == (
      2, "math_500_easy", 0)
  assert cfg.model.hf_path == "/x/y"


@pytest.mark.parametrize("bad", ["task.eval_name", "nosuch.field=1", "task.nosuch=1", "task=1"])
def test_bad_override_names_the_flag(bad):
  with pytest.raises(SystemExit, match=f"--override={bad}"):
    base_rate._load_config(CONFIG, 1, [bad])


def test_row_format():
  row = {"difficulty": 1, "avg@k": 0.125, "ci95": [0.05, 0.2], "format_rate": 0.5,
         "all_right": 0.0, "all_wrong": 0.5, "length_mean": 40.04, "truncated": 0.1,
         "seconds": 66.4}
  assert base_rate._row(row) == (
      "| 1 | 0.125 | [0.050, 0.200] | 0.500 | 0.000 | 0.500 | 40.0 | 0.100 | 66 |")
