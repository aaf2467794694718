"""The launcher takes every --config form dapo_jax.main takes."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position


def test_config_file_with_an_argument(tmp_path):
  runs = launch.expand("configs/tiny_cpu.py:runlocal=True", None, str(tmp_path))
  assert [r.name for r in runs] == ["run"]
  assert "--config=configs/tiny_cpu.py:runlocal=True" in runs[0].argv()
  assert launch.main(["--config=configs/tiny_cpu.py:runlocal=True", f"--workdir={tmp_path}",
                      "--dry_run"]) == 0
  with pytest.raises(ValueError, match="unknown option 'bogus'"):
    launch.expand("configs/tiny_cpu.py:bogus=1", None, str(tmp_path))


def test_sweep_with_a_file_argument(tmp_path):
  runs = launch.expand("configs/ladder.py:base=qwen25_32b", "eps_high", str(tmp_path))
  assert runs[0].config_arg == "configs/ladder.py:rung=dapo,seed=0,base=qwen25_32b"
  with pytest.raises(ValueError, match=r"sets \['rung'\] in each of its runs.*"
                     r"--only=dapo_s0,dapo_s1,.*python -m dapo_jax.main "
                     r"--config=configs/ladder.py:rung=dapo"):
    launch.expand("configs/ladder.py:rung=dapo", "ladder", str(tmp_path))
