"""The config is pinned to a run: --resume refuses a changed algorithm / optimizer / model /
data / seed field, listing each, before anything is written; a resumable field (train.num_steps)
changes with a printed line and a record in config.history.jsonl."""
import json
import os
import subprocess
import sys

import pytest

from configs import tiny_cpu
from dapo_jax import config as config_lib
from dapo_jax import job
from dapo_jax.workdir import run_config
from tests import compile_cache
from tests.test_trainer import fake_rewards, tiny_config  # noqa: F401  (autouse fixture)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")  # the refusal test starts `main`


def _saved(workdir, cfg, step=3):
  """A checkpoint's metadata as trainer._meta writes it (only what the pin check reads)."""
  meta = workdir / "checkpoints" / str(step) / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({"step": step,
                                             "config": run_config.as_record(cfg)}))


def test_pinned_fields_are_listed(tmp_path):
  _saved(tmp_path, tiny_config())
  changed = tiny_config(**{"algo.eps_high": 0.4, "optim.lr": 1e-3})
  with pytest.raises(ValueError, match=r"config: --resume of .* changes fields its checkpoint "
                     r"\(step 3\) was trained with: algo.eps_high 0.28 -> 0.4, optim.lr 5e-05 "
                     r"-> 0.001\. .*start a new run in another --workdir"):
    run_config.check_start(changed, tmp_path, resume=True)
  with pytest.raises(ValueError, match=r"seed 0 -> 1"):
    run_config.check_start(config_lib.parse(_with_seed(1)), tmp_path, resume=True)


def _with_seed(seed):
  from tests.test_trainer import tiny_dict  # pylint: disable=import-outside-toplevel
  c = tiny_dict()
  c.seed = seed
  return c


def test_resumable_fields_pass_and_are_returned(tmp_path):
  _saved(tmp_path, tiny_config())
  start = run_config.check_start(
      tiny_config(**{"train.num_steps": 5, "log.progress": True, "mesh.data": -1}),
      tmp_path, resume=True)
  assert start.step == 3
  assert start.changes == (run_config.Change("log.progress", False, True),
                           run_config.Change("train.num_steps", 2, 5))
  assert run_config.resumable("checkpoint.keep") and not run_config.resumable("algo.eps_low")


def test_every_resumable_name_is_a_config_field_or_section():
  fields = run_config.flatten(run_config.as_record(tiny_config()))
  for name in run_config.RESUMABLE:
    assert any(f == name or (name.endswith(".") and f.startswith(name)) for f in fields), name


def test_a_field_the_checkpoint_predates_is_not_compared(tmp_path):
  record = run_config.as_record(tiny_config())
  del record["task"]["skip_bad"]  # saved by a version without the field
  meta = tmp_path / "checkpoints" / "1" / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({"config": record}))
  assert run_config.check_start(tiny_config(), tmp_path, resume=True).changes == ()


def test_a_fresh_start_into_checkpoints_is_refused_before_writing(tmp_path):
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  with pytest.raises(ValueError, match=r"holds checkpoints \(steps \[2\]\) of an earlier run"):
    run_config.check_start(tiny_config(), tmp_path, resume=False)
  assert sorted(os.listdir(tmp_path)) == ["checkpoints"]


def test_resume_with_a_changed_eps_high_is_refused_and_config_json_kept(tmp_path):
  cfg = config_lib.parse(tiny_cpu.get_config("runlocal=True"))
  _saved(tmp_path, cfg)
  (tmp_path / "config.json").write_text('{"the": "old config"}')
  (tmp_path / "config.history.jsonl").write_text('{"first": "start"}\n')
  out = subprocess.run(
      [sys.executable, "-m", "dapo_jax.main", "--config=configs/tiny_cpu.py:runlocal=True",
       f"--workdir={tmp_path}", "--resume", "--config.algo.eps_high=0.4"], cwd=REPO,
      capture_output=True, text=True, timeout=300, check=False)
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: config: --resume of {tmp_path} changes fields its checkpoint "
                         f"(step 3) was trained with: algo.eps_high 0.28 -> 0.4."), last
  assert (tmp_path / "config.json").read_text() == '{"the": "old config"}'
  assert (tmp_path / "config.history.jsonl").read_text() == '{"first": "start"}\n'
  assert "Traceback" not in out.stderr  # it went to errors.log
  assert "ValueError: config: --resume" in (tmp_path / "errors.log").read_text()


def test_a_longer_resume_continues_and_is_recorded(tmp_path, capsys):
  two = tiny_config(**{"train.num_steps": 2, "checkpoint.every_steps": 1})
  three = tiny_config(**{"train.num_steps": 3, "checkpoint.every_steps": 1})
  with compile_cache.persistent_cache(tmp_path / "jax_cache"):  # the resume compiles nothing
    job.run_job(two, str(tmp_path / "run"), resume=False, config_json='{"num_steps": 2}')
    _, results = job.run_job(three, str(tmp_path / "run"), resume=True,
                                  config_json='{"num_steps": 3}')
  tmp_path = tmp_path / "run"
  assert results["steps"] == 3
  assert "[resume] config.train.num_steps: 2 -> 3 (may change on a resume" in \
      capsys.readouterr().out
  history = [json.loads(line) for line in
             (tmp_path / "config.history.jsonl").read_text().splitlines()]
  assert [h["resumed_from_step"] for h in history] == [None, 2]
  assert [h["changes"] for h in history] == [{}, {"train.num_steps": [2, 3]}]
  assert [h["config"]["train"]["num_steps"] for h in history] == [2, 3]  # both kept
  assert (tmp_path / "config.json").read_text() == '{"num_steps": 3}'
  assert json.loads((tmp_path / "results.json").read_text())["steps"] == 3
