"""A run's workdir is its own: a second run is refused naming the holder and touches nothing;
a stale lock (its process gone, or silent for too long) is taken over with a message."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from dapo_jax.workdir import lock as run_lock
from tests import fake_bucket

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")  # test_second_run... starts a process


def _write_lock(workdir, **fields):
  record = {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": None,
            "started": time.time(), "heartbeat": time.time(), "argv": ["train"]} | fields
  (workdir / run_lock.LOCK).write_text(json.dumps(record))
  return record


def _dead_pid() -> int:
  p = subprocess.Popen([sys.executable, "-c", "pass"])
  p.wait()
  return p.pid


def test_the_holder_is_named_and_the_lock_released(tmp_path):
  lock = run_lock.acquire(tmp_path)
  held = json.loads((tmp_path / "run.lock").read_text())
  assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
  with pytest.raises(run_lock.RunLocked, match=rf"in use by pid {os.getpid()} on host "
                     rf"{socket.gethostname()} .*use another --workdir"):
    run_lock.acquire(tmp_path)
  lock.release()
  assert not (tmp_path / "run.lock").exists()
  run_lock.acquire(tmp_path).release()  # free again


def test_a_lock_of_a_finished_process_is_taken_over(tmp_path, capsys):
  pid = _dead_pid()
  _write_lock(tmp_path, pid=pid)
  with run_lock.acquire(tmp_path):
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
  assert f"taking over the stale lock {tmp_path}/run.lock (process {pid} on this host" in \
      capsys.readouterr().out


def test_a_recycled_pid_is_not_the_holder(tmp_path, capsys):
  """The lock names this (live) PID but another start time: the PID was reused."""
  _write_lock(tmp_path, pid=os.getpid(), pid_start="1")
  run_lock.acquire(tmp_path).release()
  assert "is gone" in capsys.readouterr().out


def test_another_hosts_lock_is_stale_only_after_its_heartbeat_stops(tmp_path, capsys):
  _write_lock(tmp_path, host="tpu-worker-0", pid=1)
  with pytest.raises(run_lock.RunLocked, match="pid 1 on host tpu-worker-0"):
    run_lock.acquire(tmp_path)
  _write_lock(tmp_path, host="tpu-worker-0", pid=1,
              heartbeat=time.time() - run_lock.STALE_AFTER_S - 5)
  run_lock.acquire(tmp_path).release()
  assert "no heartbeat for" in capsys.readouterr().out


def test_the_heartbeat_is_refreshed(tmp_path, monkeypatch):
  monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
  with run_lock.acquire(tmp_path):
    first = json.loads((tmp_path / "run.lock").read_text())["heartbeat"]
    time.sleep(0.5)
    assert json.loads((tmp_path / "run.lock").read_text())["heartbeat"] > first


def test_a_lock_in_a_bucket(tmp_path, monkeypatch):
  root = tmp_path / "bucket"
  fake_bucket.install(monkeypatch, root)
  monkeypatch.chdir(tmp_path)
  lock = run_lock.acquire("gs://b/run")
  assert json.loads((root / "b" / "run" / "run.lock").read_text())["pid"] == os.getpid()
  with pytest.raises(run_lock.RunLocked, match="gs://b/run/run.lock: the workdir is in use"):
    run_lock.acquire("gs://b/run")
  lock.release()
  assert not (root / "b" / "run" / "run.lock").exists()


def test_second_run_is_refused_and_the_first_runs_files_are_untouched(tmp_path):
  """The first run (this process) holds the workdir with its files; a second `main` on it
  exits 1 naming the holder, before writing anything."""
  (tmp_path / "checkpoints" / "3").mkdir(parents=True)
  for name, text in (("config.json", '{"seed": 0}'), ("metrics.jsonl", '{"step": 1}\n'),
                     ("config.history.jsonl", '{"changes": {}}\n')):
    (tmp_path / name).write_text(text)
  before = {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in tmp_path.rglob("*")}
  with run_lock.acquire(tmp_path):
    lock_text = (tmp_path / "run.lock").read_text()
    out = subprocess.run(
        [sys.executable, "-m", "dapo_jax.main", "--config=configs/tiny_cpu.py",
         f"--workdir={tmp_path}", "--config.seed=1", "--resume"], cwd=REPO,
        capture_output=True, text=True, timeout=300, check=False)
    assert (tmp_path / "run.lock").read_text() == lock_text  # still ours
  assert out.returncode == 1, out.stderr[-2000:]
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith(f"error: {tmp_path}/run.lock: the workdir is in use by pid "
                         f"{os.getpid()} on host {socket.gethostname()}"), last
  after = {p: (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
           for p in tmp_path.rglob("*")}
  assert after == before  # no errors.log either: the refused run never held the workdir


_RACE = r"""
import json, multiprocessing as mp, os, subprocess, sys, time
from dapo_jax.workdir import lock as run_lock

def contender(workdir, barrier, out):
  barrier.wait()
  try:
    lock = run_lock.acquire(workdir)
  except run_lock.RunLocked:
    out.put(None)
    return
  t0 = time.monotonic()
  time.sleep(0.05)
  out.put((t0, time.monotonic()))
  lock.release()

if __name__ == "__main__":
  root, trials = sys.argv[1], int(sys.argv[2])
  dead = subprocess.Popen([sys.executable, "-c", "pass"]); dead.wait()
  ctx = mp.get_context("fork")
  both = 0
  for i in range(trials):
    workdir = os.path.join(root, str(i)); os.makedirs(workdir)
    with open(os.path.join(workdir, run_lock.LOCK), "w") as f:  # stale: its process is gone
      json.dump({"host": os.uname().nodename, "pid": dead.pid, "pid_start": None,
                 "started": 0, "heartbeat": 0, "argv": ["old"]}, f)
    barrier, out = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=contender, args=(workdir, barrier, out)) for _ in range(2)]
    [p.start() for p in procs]
    held = [out.get(timeout=60) for _ in procs]
    [p.join() for p in procs]
    spans = [h for h in held if h]
    both += len(spans) == 2 and spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1]
    assert spans, f"trial {i}: nobody took the stale lock"
  print(json.dumps({"trials": trials, "both_held": both}))
"""


def test_raced_takeovers_of_a_stale_lock_leave_one_holder(tmp_path):
  """Two processes released together at a stale lock, 40 times: the holds never overlap."""
  script = tmp_path / "race.py"
  script.write_text(_RACE)
  out = subprocess.run([sys.executable, str(script), str(tmp_path / "w"), "200"], cwd=REPO,
                       env=dict(os.environ, PYTHONPATH=REPO), capture_output=True, text=True,
                       timeout=300, check=False)
  assert out.returncode == 0, out.stderr[-2000:]
  assert json.loads(out.stdout.strip().splitlines()[-1]) == {"trials": 200, "both_held": 0}
  leftovers = [p.name for p in (tmp_path / "w").rglob("*") if p.is_file()]
  assert leftovers == [], leftovers  # no lock, no aside file, no half-written file


def test_an_empty_lock_is_refused_while_fresh_and_taken_over_when_old(tmp_path, capsys):
  (tmp_path / run_lock.LOCK).write_text("")
  with pytest.raises(run_lock.RunLocked,
                     match=r"the lock is unreadable \(0 bytes, not JSON\).*taken over"):
    run_lock.acquire(tmp_path)
  hour_ago = time.time() - 3600
  os.utime(tmp_path / run_lock.LOCK, (hour_ago, hour_ago))
  with run_lock.acquire(tmp_path):
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
  assert "unreadable for 3600 s" in capsys.readouterr().out


def test_a_failed_create_names_the_lock_and_leaves_nothing(tmp_path, monkeypatch):
  import errno  # pylint: disable=g-import-not-at-top
  def full(*_):
    raise OSError(errno.ENOSPC, "No space left on device")
  monkeypatch.setattr(run_lock.os, "link", full)
  with pytest.raises(OSError, match=rf"{tmp_path}/run.lock: cannot create the run lock "
                     r"\(No space left on device\)"):
    run_lock.acquire(tmp_path)
  assert list(tmp_path.iterdir()) == []
