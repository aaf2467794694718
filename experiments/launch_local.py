"""The local backends of experiments/launch.py: runs as processes of this machine (local), or
each run as N local processes of one multi-host run over loopback (multihost)."""
import dataclasses
import datetime
import os
import shlex
import socket
import subprocess
import sys
import time

import launch_runs
from launch_runs import REPO, LaunchError, Outcome, RunSpec, outcome, summary_row


@dataclasses.dataclass(frozen=True)
class Deadline:
  """--stop_at: the time by which every started run must be able to finish (epoch seconds),
  and one run's expected length (seconds) before this launch has timed one."""
  at: float
  run_s: float

  def allows(self, now: float, longest_s: float) -> bool:
    return now + max(self.run_s, longest_s) <= self.at


def deadline(text: str, run_minutes: float | None, now: float | None = None) -> Deadline:
  """--stop_at's HH:MM (today, local time), ISO date-time or +MINUTES; LaunchError naming the
  flag when it reads as none of these, or when --run_minutes is missing."""
  now = time.time() if now is None else now
  if run_minutes is None or run_minutes <= 0:
    raise LaunchError("--stop_at needs --run_minutes > 0 (how long one run takes here; the "
                      "longest run the launch finishes counts too)")
  try:
    if text.startswith("+"):
      at = now + 60 * float(text[1:])
    elif len(text) <= 5 and ":" in text:
      hh, mm = (int(x) for x in text.split(":"))
      at = datetime.datetime.fromtimestamp(now).replace(
          hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    else:
      at = datetime.datetime.fromisoformat(text).timestamp()
  except ValueError as e:
    raise LaunchError(f"--stop_at={text}: expected HH:MM, an ISO date-time (2026-12-07T12:45) "
                      f"or +MINUTES ({e})") from None
  return Deadline(at, 60 * run_minutes)


def collect_finished(runs: list[RunSpec], results_dir: str) -> None:
  """--results_dir: the logs of runs that finished in the workdir but were never copied."""
  for run in runs:
    if results_dir and run.status() == "finished" and not launch_runs.in_results(run,
                                                                                 results_dir):
      launch_runs.copy_small_logs(run, results_dir)
      print(f"[launch] {run.name}: logs copied to {results_dir}", flush=True)


def local_commands(run: RunSpec):
  return [(run.argv(), dict(os.environ))]


def multihost_commands(run: RunSpec, num_processes: int, devices_per_process: int):
  """One command per local process: jax.distributed over loopback with gloo CPU collectives."""
  port = _free_port()
  out = []
  for pid in range(num_processes):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={devices_per_process}").strip()
    env["JAX_PLATFORMS"] = "cpu"
    argv = run.argv() + [
        "--config.distributed.enabled=True",
        f"--config.distributed.coordinator_address=127.0.0.1:{port}",
        f"--config.distributed.num_processes={num_processes}",
        f"--config.distributed.process_id={pid}",
        "--config.distributed.cpu_collectives=gloo"]
    out.append((argv, env))
  return out


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(cmds, log_path):
  """The processes, each appending to its log; and where this launch's lines begin in it."""
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  offset = os.path.getsize(log_path) if os.path.exists(log_path) else 0
  procs = []
  for i, (argv, env) in enumerate(cmds):
    path = log_path if i == 0 else log_path.replace(".txt", f".p{i}.txt")
    f = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    procs.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT),
                  f))
  return procs, offset


def _ended(run: RunSpec, started, t0: float, args) -> Outcome:
  """The run's outcome from this launch's lines of its log (not an earlier launch's)."""
  procs, offset = started
  for _, f in procs:
    f.close()
  rc = next((p.returncode for p, _ in procs if p.returncode != 0), 0)
  with open(launch_runs.log_path(run), "rb") as f:
    f.seek(offset)
    lines = f.read().decode("utf-8", errors="replace").splitlines()[-200:]
  out = outcome(run, rc, lines, wall_s=time.time() - t0, launch_id=getattr(args, "launch_id", ""))
  results_dir = getattr(args, "results_dir", "")
  launch_runs.copy_log(run)
  if results_dir and out.state in ("finished", "failed"):
    launch_runs.copy_small_logs(run, results_dir, failed=out.state == "failed")
  return out


def launch_local(args, runs: list[RunSpec]) -> dict:
  """local / multihost: up to --parallel runs at once (multihost: one run of N processes)."""
  make = (local_commands if args.backend == "local" else
          lambda r: multihost_commands(r, args.num_processes, args.devices_per_process))
  if args.dry_run:
    for run in runs:
      for argv_, _ in make(run):
        print(" ".join(shlex.quote(a) for a in argv_), flush=True)
    return {}
  width = args.parallel if args.backend == "local" else 1
  queue, live, outcomes, longest = list(runs), [], {}, 0.0
  stop_at = getattr(args, "stop_at", None)
  while queue or live:
    if queue and stop_at and not stop_at.allows(time.time(), longest):
      when = datetime.datetime.fromtimestamp(stop_at.at).isoformat(timespec="minutes")
      print(f"[launch] --stop_at {when}: {len(queue)} run(s) not started (one takes "
            f"~{max(stop_at.run_s, longest) / 60:.1f} min)", flush=True, file=sys.stderr)
      outcomes.update({r.name: Outcome("not started", f"could not finish by {when}; rerun the "
                                       f"launch") for r in queue})
      queue = []
    while queue and len(live) < width:
      run = queue.pop(0)
      print(f"[launch] {run.name} ({run.status()}) -> {run.workdir}", flush=True)
      live.append((run, _start(make(run), launch_runs.log_path(run)), time.time()))
    time.sleep(0.5)
    for item in list(live):
      run, procs, t0 = item
      if all(p.poll() is not None for p, _ in procs[0]):
        outcomes[run.name] = _ended(run, procs, t0, args)
        if outcomes[run.name].state == "finished":
          longest = max(longest, outcomes[run.name].wall_s)
        print(f"[launch] {summary_row(run, outcomes[run.name])}", flush=True)
        live.remove(item)
  return outcomes
