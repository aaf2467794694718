"""Faults in a tiny training run: a kill at the metrics/checkpoint seam, SIGTERM, and resuming a
finished run. Each resumed run must end bitwise equal to the uninterrupted one."""
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from dapo_jax.train import checkpoint as ckpt_lib
from dapo_jax.train import trainer
from tests.test_trainer import fake_rewards, tiny_config  # noqa: F401  (autouse fixture)

# Starts processes of its own (real signals, deadlines): under `pytest -n 2` these modules share
# one worker (--dist loadgroup), so two of them never compete for the 2 cores.
pytestmark = pytest.mark.xdist_group("subprocess")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 2
VOLATILE = ("time_", "tokens_per_s")


class _Killed(Exception):
  """Stands in for SIGKILL inside the process (the test goes on afterwards)."""


def _cfg():
  return tiny_config(**{"train.num_steps": STEPS, "checkpoint.every_steps": 1})


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in f]


def _train(workdir, resume=False):
  run = trainer.build(_cfg(), str(workdir), resume=resume)
  return run, trainer.train(run, resume=resume)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  wd = tmp_path_factory.mktemp("reference")
  from tests import test_trainer  # pylint: disable=import-outside-toplevel
  from dapo_jax import rewards  # pylint: disable=import-outside-toplevel
  with pytest.MonkeyPatch.context() as mp:  # module scope: before the autouse fixture
    mp.setitem(rewards.REWARD_FNS, "hash", test_trainer._hash_reward)  # pylint: disable=protected-access
    run, results = _train(wd)
  return run, results, _records(wd)


def _assert_same_as(reference, run, results, workdir):
  ref_run, ref_results, ref_records = reference
  assert _records(workdir) == ref_records  # one record per step, equal values
  assert results["before"] == ref_results["before"] and results["after"] == ref_results["after"]
  for a, b in zip(jax.tree.leaves(ref_run.loop.state), jax.tree.leaves(run.loop.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert run.data.state() == ref_run.data.state()


def test_kill_between_metrics_line_and_checkpoint(tmp_path, monkeypatch, reference, capsys):
  save = ckpt_lib.Checkpointer.save

  def save_or_die(self, step, state, meta):
    if step == 2:  # step 2's metrics line is written; its checkpoint never will be
      raise _Killed()
    return save(self, step, state, meta)

  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save_or_die)
  with pytest.raises(_Killed):
    _train(tmp_path)
  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save)
  run, results = _train(tmp_path, resume=True)
  assert "kept 2 records, dropped 1 written after the restored checkpoint" in \
      capsys.readouterr().out
  _assert_same_as(reference, run, results, tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_stop_signal_saves_at_the_step_boundary_then_resume_finishes(tmp_path, monkeypatch,
                                                                       reference, sig):
  step_fn = trainer.rollout_step
  before = signal.getsignal(sig)

  def step_then_signal(run, *args, **kwargs):
    out = step_fn(run, *args, **kwargs)
    if run.loop.step == 0:  # during step 1 (Ctrl-C, a preemption notice, a dropped ssh session)
      os.kill(os.getpid(), sig)
    return out

  monkeypatch.setattr(trainer, "rollout_step", step_then_signal)
  run, results = _train(tmp_path)
  assert results["preempted"] and results["steps"] == 1 and "after" not in results
  assert results["signal"] == sig.name
  assert signal.getsignal(sig) is before  # the handler is removed again
  assert ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), keep=2,
                               async_save=False).steps() == [1]
  monkeypatch.setattr(trainer, "rollout_step", step_fn)
  run, results = _train(tmp_path, resume=True)
  _assert_same_as(reference, run, results, tmp_path)


def test_resume_of_a_finished_run_does_nothing(tmp_path):
  with open(tmp_path / "results.json", "w", encoding="utf-8") as f:
    json.dump({"steps": 80, "after": {}}, f)
  out = subprocess.run(
      [sys.executable, "-m", "dapo_jax.main", "--config=configs/tiny_cpu.py",
       f"--workdir={tmp_path}", "--resume"], cwd=REPO, capture_output=True, text=True,
      timeout=120, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert "already finished its 80 steps (results.json): nothing to do" in out.stdout
  assert sorted(os.listdir(tmp_path)) == ["results.json"]


def test_a_corrupt_results_json_is_named(tmp_path):
  (tmp_path / "results.json").write_text('{"steps": 80,')
  out = subprocess.run(
      [sys.executable, "-m", "dapo_jax.main", "--config=configs/tiny_cpu.py",
       f"--workdir={tmp_path}", "--resume"], cwd=REPO, capture_output=True, text=True,
      timeout=120, check=False)
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {tmp_path}/results.json: not a run's results"), last
  state = json.loads((tmp_path / "state.json").read_text())
  assert state["state"] == "failed" and state["error"] == last


def test_a_fresh_run_refuses_an_earlier_runs_checkpoints(tmp_path):
  os.makedirs(tmp_path / "checkpoints" / "2")
  with pytest.raises(ValueError, match=r"holds checkpoints \(steps \[2\]\).*--resume"):
    _train(tmp_path)


def test_unwritable_checkpoint_directory_is_the_last_line(tmp_path):
  (tmp_path / "checkpoints").write_text("a file where the checkpoint directory goes")
  out = subprocess.run(
      [sys.executable, "-m", "dapo_jax.main", "--config=configs/tiny_cpu.py:runlocal=True",
       f"--workdir={tmp_path}", "--config.log.progress=False", "--config.eval.num_problems=2"],
      cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1"))
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: cannot use checkpoint directory {tmp_path}/checkpoints"), last
