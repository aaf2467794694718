"""The local backends of experiments/launch.py: runs as processes of this machine (local), or
each run as N local processes of one multi-host run over loopback (multihost)."""
import os
import shlex
import socket
import subprocess
import time

import launch_runs
from launch_runs import REPO, Outcome, RunSpec, outcome, summary_row


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
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  procs = []
  for i, (argv, env) in enumerate(cmds):
    path = log_path if i == 0 else log_path.replace(".txt", f".p{i}.txt")
    f = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    procs.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT),
                  f))
  return procs


def _ended(run: RunSpec, procs, t0: float) -> Outcome:
  for _, f in procs:
    f.close()
  rc = next((p.returncode for p, _ in procs if p.returncode != 0), 0)
  with open(launch_runs.log_path(run), encoding="utf-8", errors="replace") as f:
    lines = f.read().splitlines()[-200:]
  out = outcome(run, rc, lines, wall_s=time.time() - t0)
  launch_runs.copy_log(run)
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
  queue, live, outcomes = list(runs), [], {}
  while queue or live:
    while queue and len(live) < width:
      run = queue.pop(0)
      print(f"[launch] {run.name} ({run.status()}) -> {run.workdir}", flush=True)
      live.append((run, _start(make(run), launch_runs.log_path(run)), time.time()))
    time.sleep(0.5)
    for item in list(live):
      run, procs, t0 = item
      if all(p.poll() is not None for p, _ in procs):
        outcomes[run.name] = _ended(run, procs, t0)
        print(f"[launch] {summary_row(run, outcomes[run.name])}", flush=True)
        live.remove(item)
  return outcomes
