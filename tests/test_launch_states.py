"""The launcher tells a finished run from a preempted or a failed one: a SIGTERMed child is
preempted (and the next launch resumes it), a failing one shows its last `error:` line, the
summary names each run's state and the exit status is 1 when any run did not finish."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position
import launch_local  # noqa: E402  pylint: disable=wrong-import-position

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")

# Stand-ins for four children (each a `python -c` that leaves what a real run would leave).
_CHILDREN = {
    "dapo_s0": "import json,os; json.dump({'steps': 2, 'after': {'avg@4': 0.5}}, "
               "open(os.path.join(W, 'results.json'), 'w'))",
    "dapo_s1": "import sys; print('[data] ...'); print('error: config.algo.eps_high: must be "
               ">= 0, got -1.0', file=sys.stderr); sys.exit(1)",
    "dapo_s2": "import os; os.makedirs(os.path.join(W, 'checkpoints', '3'))",
    "dapo_s3": "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "dapo_s4": "import os; print('step 1/4', flush=True); os.kill(os.getpid(), 9)",
}


def test_each_outcome_is_named_in_the_summary(tmp_path, monkeypatch, capsys):
  def fake_commands(run):
    code = f"W = {run.workdir!r}; " + _CHILDREN[run.name.replace("naive_grpo", "dapo")]
    return [([sys.executable, "-c", code], dict(os.environ))]

  monkeypatch.setattr(launch_local, "local_commands", fake_commands)
  rc = launch.main(["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={tmp_path}",
                    "--parallel=2", "--only=dapo_s0,dapo_s1,dapo_s2,dapo_s3,dapo_s4"])
  assert rc == 1
  rows = capsys.readouterr().out.split("== summary ==")[1].strip().splitlines()
  states = {r.split()[0]: r for r in rows}
  assert states["dapo_s0"].split()[1] == "finished"
  assert states["dapo_s1"].split()[1] == "failed" and states["dapo_s1"].endswith(
      "exit 1: error: config.algo.eps_high: must be >= 0, got -1.0")
  assert states["dapo_s2"].split()[1] == "preempted" and states["dapo_s2"].endswith(
      "saved at step 3; rerun the same launch to resume it (--resume)")
  assert states["dapo_s3"].split()[1] == "preempted" and states["dapo_s3"].endswith(
      "no checkpoint yet; rerun the same launch to start it again")
  assert states["dapo_s4"].split()[1] == "failed" and states["dapo_s4"].endswith(
      "exit -9: killed by SIGKILL")


TINY = ["model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=1",
        "model.num_heads=2", "model.num_kv_heads=1", "model.head_dim=16", "task.num_train=200",
        "rollout.group_size=4", "rollout.max_new_tokens=8", "rollout.num_slots=16",
        "algo.dynamic_sampling=False", "algo.overlong_cache_len=2", "train.num_steps=50",
        "train.batch_size=4", "train.num_minibatches=2", "eval.num_problems=4",
        "eval.num_samples=2", "eval.bootstrap_samples=10", "log.tensorboard=False",
        "checkpoint.every_steps=1", "checkpoint.async_save=False", "checkpoint.export_hf=False"]


def _train_records(path):
  if not os.path.exists(path):
    return 0
  with open(path, encoding="utf-8") as f:
    return sum(json.loads(line)["kind"] == "train" for line in f if line.strip())


def test_a_sigtermed_child_is_preempted_and_resumed_by_the_next_launch(tmp_path):
  argv = [sys.executable, "experiments/launch.py",
          "--config=configs/tiny_cpu.py:init=True,runlocal=True", f"--workdir={tmp_path}",
          *[f"--set={s}" for s in TINY]]
  run_dir = tmp_path / "run"
  run_dir.mkdir()  # an earlier launch of this run failed: its last line stays in the log
  (run_dir / "log.txt").write_text("error: config.algo.eps_high: must be >= 0, got -1.0\n")
  launcher = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
  try:
    deadline = time.time() + 900
    while _train_records(run_dir / "metrics.jsonl") < 1:  # the child is training
      assert time.time() < deadline and launcher.poll() is None, (run_dir / "log.txt").read_text()
      time.sleep(0.2)
    pid = json.loads((run_dir / "run.lock").read_text())["pid"]
    # A second run on the same workdir is refused, naming the child.
    second = subprocess.run([sys.executable, "-m", "dapo_jax.main",
                             "--config=configs/tiny_cpu.py:init=True,runlocal=True",
                             f"--workdir={run_dir}", "--resume"], cwd=REPO,
                            capture_output=True, text=True, timeout=300, check=False)
    assert second.returncode == 1
    assert f"the workdir is in use by pid {pid}" in second.stderr.strip().splitlines()[-1]
    os.kill(pid, signal.SIGTERM)
    out, _ = launcher.communicate(timeout=600)
  finally:
    if launcher.poll() is None:
      launcher.kill()
  assert launcher.returncode == 1, out[-3000:]
  row = out.split("== summary ==")[1].strip().splitlines()[0].split()
  assert row[:2] == ["run", "preempted"] and "rerun the same launch to resume it" in out, out
  assert not (run_dir / "run.lock").exists() and not (run_dir / "results.json").exists()
  state = json.loads((run_dir / "state.json").read_text())
  assert (state["state"], state["signal"], state["step"]) == ("preempted", "SIGTERM", 1), state
  assert state["launch"], "the launch's id, so that a later launch reads only its own"
  # The run's console: its progress lines and a few more; orbax's INFO lines (~40 a save, one
  # save a step here) went to library.log
  console = (run_dir / "log.txt").read_text().splitlines()[1:]  # after the earlier launch's
  others = [ln for ln in console if "] step " not in ln]
  assert len(others) <= 30 and not any(ln.startswith(("I1", "I0")) for ln in console), others
  assert "checkpoint" in (run_dir / "library.log").read_text()
  again = subprocess.run(argv + ["--dry_run"], cwd=REPO, capture_output=True, text=True,
                         timeout=300, check=True)
  assert again.stdout.strip().endswith("--resume"), again.stdout
