"""The run's own record of how its last start ended: `<workdir>/state.json`.

A launcher that does not own the run's process (a pod's run started detached on its workers, a
`launch.py --status` from another machine, a launch after an earlier one) reads the run's
state here instead of guessing it from an exit status or a shared log. Process 0 writes it:

  running      the start passed its checks and holds the workdir (`host`, `pid`)
  preempted    a stop signal (`signal`: SIGTERM, SIGINT or SIGHUP) was honoured: the step in
               progress finished and was saved (`step`); --resume continues
  interrupted  stopped by a signal before the training loop began (nothing new saved)
  finished     results.json is written
  failed       the last `error:` line the run printed (`error`)

Each record carries `launch`, the launcher's DAPO_LAUNCH_ID when one started it, so that a
launcher reads only its own launch's outcome. A run killed outright (SIGKILL, a lost VM) leaves
`running`: its lock's heartbeat (dapo_jax.workdir.lock) then tells whether it is still alive.
"""
import json
import os
import socket
import time

from dapo_jax.workdir import paths

STATE = "state.json"
STATES = ("running", "preempted", "interrupted", "finished", "failed")
LAUNCH_ENV = "DAPO_LAUNCH_ID"
PREEMPTED_EXIT = 75  # EX_TEMPFAIL: saved after a stop signal; a job controller restarts it


def write(workdir: str, state: str, **fields) -> None:
  """Replaces the record (process 0's call; a failed write is reported, never raised: the
  record must not turn a run's own outcome into another error)."""
  if state not in STATES:
    raise ValueError(f"run_state.write: unknown state {state!r}; expected one of {STATES}")
  record = {"state": state, "time": time.time(), "host": socket.gethostname(),
            "pid": os.getpid(), "launch": os.environ.get(LAUNCH_ENV, "")} | fields
  try:
    paths.write_text(f"{workdir}/{STATE}", json.dumps(record))
  except OSError as e:
    print(f"[state] could not write {workdir}/{STATE}: {e}", flush=True)


def read(workdir: str) -> dict | None:
  """The record, or None where there is none or it cannot be read (a start cut off while
  writing it is the same as no record)."""
  path = paths.resolve(workdir) / STATE
  try:
    record = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) and record.get("state") in STATES else None
