"""Runs that outlive the launcher: a pod's run started detached on every worker and followed
through its workdir, and the `--action=status` / `--action=stop` of any launch.

A run writes its own record, `<workdir>/state.json` (dapo_jax.workdir.run_state), and holds
`<workdir>/run.lock` with a heartbeat (dapo_jax.workdir.lock). Both live in the workdir (a bucket
for a pod), so the state of a run is read from any machine, whether or not the launch that
started it is still there:

  finished     results.json is there
  running      its lock's heartbeat is fresh (host, pid, heartbeat age)
  preempted    it saved after a stop signal (SIGTERM, SIGINT, SIGHUP): rerun the launch
  failed       its last `error:` line
  lost         it was running but its heartbeat stopped (killed outright, or its VM went away):
               rerun the launch to resume from its newest checkpoint
  resumable / new   no record: a checkpoint to resume from, or nothing yet
"""
import json
import os
import shlex
import signal
import socket
import time

from launch_runs import Outcome, RunSpec
from dapo_jax.workdir import paths, lock as run_lock, run_state

POLL_S = 30.0         # seconds between two reads of a detached run's workdir
START_GRACE_S = 3600  # a detached run with no record of this launch after this long failed


def _lock(run: RunSpec) -> dict | None:
  path = paths.resolve(run.workdir) / run_lock.LOCK
  try:
    return json.loads(path.read_text())
  except (OSError, ValueError):
    return None


def describe(run: RunSpec, now: float | None = None) -> tuple[str, str]:
  """(state, detail) of `run` from its workdir alone (the module docstring's states)."""
  now = time.time() if now is None else now
  if run.results() is not None:
    return "finished", ""
  lock, rec = _lock(run), run_state.read(run.workdir)
  if lock is not None and run_lock.stale_reason(lock, now) is None:
    return "running", (f"pid {lock.get('pid')} on {lock.get('host')}, heartbeat "
                       f"{now - float(lock.get('heartbeat', now)):.0f} s ago")
  if rec is not None and rec["state"] in ("preempted", "interrupted"):
    return "preempted", (f"{rec.get('signal') or 'a stop signal'} at step {rec.get('step', '?')};"
                         f" rerun the same launch to resume it")
  if rec is not None and rec["state"] == "failed":
    return "failed", rec.get("error", "")
  if rec is not None and rec["state"] == "running":
    why = run_lock.stale_reason(lock, now) if lock else "no lock"
    return "lost", (f"started on {rec.get('host')} (pid {rec.get('pid')}), then stopped "
                    f"without a word ({why}): rerun the same launch to resume it")
  step = run.checkpoint()
  return ("resumable", f"checkpoint at step {step}") if step is not None else ("new", "")


def status(runs: list[RunSpec]) -> int:
  """--action=status: one line per run; 0 when every run finished."""
  states = []
  for run in runs:
    state, detail = describe(run)
    states.append(state)
    print(f"{run.name:<28} {state:<10} {detail}", flush=True)
  return 0 if all(s == "finished" for s in states) else 1


def stop_local(runs: list[RunSpec]) -> int:
  """--action=stop (local backends): SIGTERM to each running run's process on this host (it
  saves at the end of its step, then exits); a run on another host is named, not signalled."""
  for run in runs:
    state, _ = describe(run)
    lock = _lock(run) or {}
    if state != "running":
      print(f"{run.name:<28} {state}: nothing to stop", flush=True)
    elif lock.get("host") != socket.gethostname():
      print(f"{run.name:<28} running on {lock.get('host')}: stop it there", flush=True)
    else:
      os.kill(int(lock["pid"]), signal.SIGTERM)
      print(f"{run.name:<28} SIGTERM sent to pid {lock['pid']}: it saves at the end of its "
            f"step; --action=status shows when it stopped", flush=True)
  return 0


def pod_stop_script(run: RunSpec) -> str:
  """The worker-side command that sends SIGTERM to `run`'s processes (every worker)."""
  pattern = shlex.quote(f"dapo_jax.main .*--workdir={run.workdir}( |$)")
  return f"pkill -TERM -f {pattern} || true"


def detached_script(run: RunSpec, *, repo_dir: str, python: str, log_dir: str,
                    launch_id: str) -> str:
  """The worker-side command that starts `run` in a session of its own (setsid: no SIGHUP
  when the ssh session ends), its output in <log_dir>/<run>.<worker host>.log, and returns."""
  inner = " ".join(shlex.quote(a) for a in run.argv(python=python))
  log = f"{log_dir}/{run.name}.$(hostname).log"
  return (f"mkdir -p {log_dir} && cd {repo_dir} && {run_state.LAUNCH_ENV}={launch_id} "
          f"nohup setsid {inner} > {log} 2>&1 < /dev/null &")


def follow(run: RunSpec, launch_id: str, *, log_hint: str) -> Outcome:
  """Waits for a detached run of this launch to end, reading its workdir every POLL_S."""
  t0, last = time.time(), None
  while True:
    time.sleep(POLL_S)
    rec = run_state.read(run.workdir)
    ours = rec is not None and rec.get("launch") == launch_id
    state, detail = describe(run) if ours or run.results() is not None else ("starting", "")
    if state != last:
      print(f"[pod] {run.name}: {state} {detail}".rstrip(), flush=True)
      last = state
    if state in ("finished", "preempted", "failed", "lost"):
      kind = "preempted" if state == "lost" else state
      return Outcome(kind, detail, time.time() - t0)
    if not ours and time.time() - t0 > START_GRACE_S:
      return Outcome("failed", f"no record of this launch in {run.workdir}/"
                     f"{run_state.STATE} after {START_GRACE_S:.0f} s: {log_hint}",
                     time.time() - t0)
