"""A run's state read from its workdir alone (state.json, run.lock's heartbeat, results.json),
as `launch.py --action=status` and a pod's detached launch read it; `--action=stop` on this
host; a detached run that goes silent is reported lost, one that never starts failed."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position
import launch_detached  # noqa: E402  pylint: disable=wrong-import-position
from launch_runs import RunSpec  # noqa: E402  pylint: disable=wrong-import-position

HOST = socket.gethostname()


def _run(tmp_path, name="r"):
  wd = tmp_path / name
  wd.mkdir()
  return RunSpec(name, "configs/tiny_cpu.py", {}, str(wd))


def _write(run, name, record):
  with open(os.path.join(run.workdir, name), "w", encoding="utf-8") as f:
    json.dump(record, f)


def test_each_state_is_read_from_the_workdir(tmp_path):
  now = time.time()
  run = _run(tmp_path)
  assert launch_detached.describe(run, now) == ("new", "")
  os.makedirs(os.path.join(run.workdir, "checkpoints", "4"))
  assert launch_detached.describe(run, now) == ("resumable", "checkpoint at step 4")
  _write(run, "state.json", {"state": "running", "host": "w0", "pid": 7})
  _write(run, "run.lock", {"host": "w0", "pid": 7, "heartbeat": now - 30})
  state, detail = launch_detached.describe(run, now)
  assert state == "running" and detail == "pid 7 on w0, heartbeat 30 s ago"
  state, detail = launch_detached.describe(run, now + 3600)  # the heartbeat stopped an hour ago
  assert state == "lost" and detail.startswith("started on w0 (pid 7), then stopped without")
  os.unlink(os.path.join(run.workdir, "run.lock"))
  _write(run, "state.json", {"state": "failed", "error": "error: out of memory"})
  assert launch_detached.describe(run, now) == ("failed", "error: out of memory")
  _write(run, "state.json", {"state": "preempted", "signal": "SIGHUP", "step": 4})
  assert launch_detached.describe(run, now) == (
      "preempted", "SIGHUP at step 4; rerun the same launch to resume it")
  _write(run, "results.json", {"steps": 8})
  assert launch_detached.describe(run, now) == ("finished", "")


def test_follow_reports_a_silent_run_lost_and_a_missing_one_failed(tmp_path, monkeypatch):
  monkeypatch.setattr(launch_detached, "POLL_S", 0.0)
  run = _run(tmp_path)
  _write(run, "state.json", {"state": "running", "host": "w0", "pid": 7, "launch": "L1"})
  _write(run, "run.lock", {"host": "w0", "pid": 7, "heartbeat": time.time() - 7200})
  out = launch_detached.follow(run, "L1", log_hint="see the logs")
  assert out.state == "preempted" and "then stopped without a word" in out.detail
  monkeypatch.setattr(launch_detached, "START_GRACE_S", 0.0)  # an earlier launch's record
  out = launch_detached.follow(run, "L2", log_hint="see the logs")
  assert out.state == "failed" and out.detail.endswith("after 0 s: see the logs")


def test_stop_sends_sigterm_to_a_run_on_this_host(tmp_path, capsys):
  child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  try:
    run = _run(tmp_path)
    _write(run, "run.lock", {"host": HOST, "pid": child.pid, "heartbeat": time.time()})
    other = _run(tmp_path, "elsewhere")
    _write(other, "run.lock", {"host": "w9", "pid": 1, "heartbeat": time.time()})
    assert launch_detached.stop_local([run, other, _run(tmp_path, "idle")]) == 0
    assert child.wait(timeout=30) == -signal.SIGTERM
  finally:
    child.kill()
  out = capsys.readouterr().out
  assert f"SIGTERM sent to pid {child.pid}" in out and "running on w9: stop it there" in out
  assert "idle                         new: nothing to stop" in out


def test_status_action_reads_a_sweep(tmp_path, capsys):
  argv = ["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={tmp_path}",
          "--only=dapo_s0,dapo_s1", "--action=status"]
  os.makedirs(tmp_path / "dapo_s0")
  (tmp_path / "dapo_s0" / "results.json").write_text('{"steps": 30}')
  assert launch.main(argv) == 1
  assert [ln.split()[:2] for ln in capsys.readouterr().out.strip().splitlines()] == [
      ["dapo_s0", "finished"], ["dapo_s1", "new"]]
