"""A run's workdir is its own: a lock file held for the whole run.

`<workdir>/run.lock` holds the holder's host, PID (and its start time, so a recycled PID is not
mistaken for the holder), command line and a heartbeat refreshed every HEARTBEAT_S seconds. A
second run on the workdir is refused, naming the holder. A lock is stale, and is taken over with
a message, when its process is gone (same host: no such PID, or a PID that started at another
time) or its heartbeat is older than STALE_AFTER_S (any host; a preempted TPU VM leaves its lock
in the bucket). Locally the lock is created with O_EXCL; in a bucket (no exclusive create) it is
written and read back, so two starts within the same second may both pass there.
"""
import json
import os
import socket
import sys
import threading
import time

from dapo_jax import paths

LOCK = "run.lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0


_HELD = []  # the locks this process holds (release_held, before an os._exit)


class RunLocked(ValueError):
  """The workdir is held by another run."""


def release_held() -> None:
  """Releases every lock this process holds (for exits that skip `finally` blocks)."""
  for lock in list(_HELD):
    lock.release()


def _pid_start(pid: int) -> str | None:
  """The process's start time in clock ticks since boot (Linux /proc), or None."""
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      return f.read().rsplit(")", 1)[1].split()[19]
  except (OSError, IndexError):
    return None


def _alive(pid: int, start: str | None) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # exists, another user's
    pass
  return start is None or _pid_start(pid) in (None, start)


def _record(started: float) -> dict:
  return {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _pid_start(os.getpid()),
          "started": started, "heartbeat": time.time(), "argv": sys.argv}


def stale_reason(holder: dict, now: float | None = None) -> str | None:
  """Why the lock `holder` wrote is stale, or None while its run may still be going."""
  now = time.time() if now is None else now
  if holder.get("host") == socket.gethostname():  # the process table answers
    if _alive(holder["pid"], holder.get("pid_start")):
      return None
    return f"process {holder['pid']} on this host ({holder['host']}) is gone"
  age = now - float(holder.get("heartbeat", 0))
  if age > STALE_AFTER_S:
    return f"no heartbeat for {age:.0f} s (more than {STALE_AFTER_S:.0f} s)"
  return None


class RunLock:
  """The held lock; `release` (or the context's exit) removes it."""

  def __init__(self, path, record: dict):
    self.path, self.record = path, record
    self._stop = threading.Event()
    self._beat = threading.Thread(target=self._heartbeat, name="dapo_jax_run_lock", daemon=True)
    self._beat.start()
    _HELD.append(self)

  def _heartbeat(self):
    while not self._stop.wait(HEARTBEAT_S):
      self.record["heartbeat"] = time.time()
      try:
        paths.write_text(self.path, json.dumps(self.record))
      except OSError:  # a full disk: the run itself will say so; the lock stays as it was
        pass

  def release(self):
    if self._stop.is_set():
      return
    self._stop.set()
    _HELD.remove(self)
    try:
      paths.resolve(self.path).unlink(missing_ok=True)
    except OSError:  # the next start takes over a lock whose process is gone
      pass

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.release()


def _create(path, record: dict) -> bool:
  """Writes the lock if none exists; whether this process now holds it."""
  text = json.dumps(record)
  if paths.is_url(path):
    if path.exists():
      return False
    path.write_text(text)
    time.sleep(1.0)  # a competing start's write lands before this read-back
    return json.loads(path.read_text()) == record
  try:
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
  except FileExistsError:
    return False
  with os.fdopen(fd, "w", encoding="utf-8") as f:
    f.write(text)
  return True


def _holder(path) -> dict | None:
  """The lock's record (None if it vanished); a half-written one is read again briefly."""
  for _ in range(20):
    if not path.exists():
      return None
    try:
      return json.loads(path.read_text())
    except (ValueError, OSError):
      time.sleep(0.1)
  return {"host": "?", "pid": -1, "heartbeat": time.time(), "argv": ["(unreadable lock)"]}


def acquire(workdir) -> RunLock:
  """Takes `<workdir>/run.lock` (creating the workdir); RunLocked names the holder."""
  path = paths.makedirs(workdir) / LOCK
  started = time.time()
  for _ in range(3):
    record = _record(started)
    if _create(path, record):
      return RunLock(path, record)
    holder = _holder(path)
    if holder is None:
      continue
    why = stale_reason(holder)
    if why is None:
      raise RunLocked(_held_message(path, holder))
    print(f"[lock] taking over the stale lock {path} ({why}; it was held by pid "
          f"{holder.get('pid')} on {holder.get('host')})", flush=True)
    path.unlink(missing_ok=True)
  raise RunLocked(f"{path}: could not take the lock (other runs keep starting on this workdir)")


def _held_message(path, holder: dict) -> str:
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
  command = " ".join(holder.get("argv", []))[:200]
  return (f"{path}: the workdir is in use by pid {holder.get('pid')} on host "
          f"{holder.get('host')} (since {since}: {command}). Wait for that run to end or stop "
          f"it, or use another --workdir; if it is gone for good, delete {path}")
