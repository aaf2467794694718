"""A run's workdir is its own: a lock file held for the whole run.

`<workdir>/run.lock` holds the holder's host, PID (and its start time, so a recycled PID is not
mistaken for the holder), command line and a heartbeat refreshed every HEARTBEAT_S seconds. A
second run on the workdir is refused, naming the holder. A lock is stale, and is taken over with
a message, when its process is gone (same host: no such PID, or a PID that started at another
time) or its heartbeat is older than STALE_AFTER_S (any host; a preempted TPU VM leaves its lock
in the bucket). A lock that cannot be read (empty, or not JSON) is stale once it is older than
UNREADABLE_STALE_S.

Locally every step is atomic, so exactly one of any number of racing starts holds the lock:
- a lock is written whole to a file of its own, then hard-linked to `run.lock` (link fails if
  the name exists), so no reader ever sees a half-written lock, and a start that fails (a full
  disk) leaves nothing behind;
- a stale lock is taken over by renaming `run.lock` aside and checking that the file moved is
  the one judged stale (its inode and its bytes: a freed inode is soon reused by a rival's
  fresh lock); if a rival's fresh lock was moved instead, it is linked back and the start reads
  the holder again.
In a bucket (no exclusive create) the lock is written and read back, so two starts within the
same second may both pass there.
"""
import json
import os
import secrets
import socket
import sys
import threading
import time

from dapo_jax.workdir import paths

LOCK = "run.lock"
HEARTBEAT_S = 60.0
STALE_AFTER_S = 600.0
UNREADABLE_STALE_S = 60.0  # an empty or corrupt lock this old is no run's (a holder rewrites it
                           # every HEARTBEAT_S)


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
  if holder.get("unreadable"):
    age = now - holder["mtime"]
    if age > UNREADABLE_STALE_S:
      return f"unreadable for {age:.0f} s (more than {UNREADABLE_STALE_S:.0f} s)"
    return None
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
  mine = path.with_name(f"{LOCK}.{os.getpid()}.{secrets.token_hex(4)}")
  try:
    with open(mine, "x", encoding="utf-8") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.link(mine, path)   # atomic: fails if any lock is there
    return True
  except FileExistsError:
    return False
  except OSError as err:
    raise OSError(err.errno, f"{path}: cannot create the run lock ({err.strerror})") from None
  finally:
    mine.unlink(missing_ok=True)


def _holder(path) -> tuple[dict, tuple | None] | None:
  """The lock's record and (locally) its identity, (inode, bytes); None if it vanished. A lock
  that is empty or not JSON reads as {"unreadable": True, "mtime": ...} (a bucket's is read
  again briefly first)."""
  tries = 20 if paths.is_url(path) else 1  # locally a lock is never seen half-written
  for i in range(tries):
    try:
      if paths.is_url(path):
        return json.loads(path.read_text()), None
      with open(path, encoding="utf-8") as f:
        ino, mtime = os.fstat(f.fileno()).st_ino, os.fstat(f.fileno()).st_mtime
        text = f.read()
    except FileNotFoundError:
      return None
    except (ValueError, OSError):
      if i + 1 < tries:
        time.sleep(0.1)
      continue
    try:
      return json.loads(text), (ino, text)
    except ValueError:
      return {"unreadable": True, "mtime": mtime, "host": "?", "pid": -1,
              "detail": f"{len(text)} bytes, not JSON"}, (ino, text)
  return {"unreadable": True, "mtime": path.stat().st_mtime, "host": "?", "pid": -1,
          "detail": "cannot be read"}, None


def _remove_stale(path, judged: tuple | None) -> None:
  """Removes the lock judged stale, and only it: locally, renamed aside and checked against
  the (inode, bytes) judged (a rival's fresh lock moved by mistake is linked back)."""
  if judged is None:
    path.unlink(missing_ok=True)
    return
  aside = path.with_name(f"{LOCK}.stale.{os.getpid()}.{secrets.token_hex(4)}")
  try:
    os.rename(path, aside)
  except FileNotFoundError:
    return  # another start removed it first
  try:
    with open(aside, encoding="utf-8", errors="replace") as f:
      moved = (os.fstat(f.fileno()).st_ino, f.read())
    if moved != judged:  # not the file judged stale: put it back
      try:
        os.link(aside, path)
      except FileExistsError:  # its holder rewrote it meanwhile (its heartbeat)
        pass
  finally:
    os.unlink(aside)


def acquire(workdir) -> RunLock:
  """Takes `<workdir>/run.lock` (creating the workdir); RunLocked names the holder."""
  path = paths.makedirs(workdir) / LOCK
  started = time.time()
  for _ in range(3):
    record = _record(started)
    if _create(path, record):
      return RunLock(path, record)
    read = _holder(path)
    if read is None:
      continue
    holder, judged = read
    why = stale_reason(holder)
    if why is None:
      raise RunLocked(_held_message(path, holder))
    print(f"[lock] taking over the stale lock {path} ({why}; it was held by pid "
          f"{holder.get('pid')} on {holder.get('host')})", flush=True)
    _remove_stale(path, judged)
  raise RunLocked(f"{path}: could not take the lock (other runs keep starting on this workdir)")


def _held_message(path, holder: dict) -> str:
  if holder.get("unreadable"):
    return (f"{path}: the lock is unreadable ({holder['detail']}), written "
            f"{time.time() - holder['mtime']:.0f} s ago; it is taken over once older than "
            f"{UNREADABLE_STALE_S:.0f} s, or delete it if no run is using this workdir")
  since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("started", 0))))
  command = " ".join(holder.get("argv", []))[:200]
  return (f"{path}: the workdir is in use by pid {holder.get('pid')} on host "
          f"{holder.get('host')} (since {since}: {command}). Wait for that run to end or stop "
          f"it, or use another --workdir; if it is gone for good, delete {path}")
