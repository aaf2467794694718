"""Expands a config's sweep into runs and launches them: locally, as local processes of one
multi-host run, on every worker of a Cloud TPU VM pod, or as GKE workloads through xpk.

  python experiments/launch.py --config=configs/ladder.py --sweep=ladder --backend=local \
      --workdir=runs/ladder --parallel=1
  python experiments/launch.py --config=configs/ladder.py --sweep=eps_high --backend=multihost \
      --num_processes=2 --workdir=runs/eps
  python experiments/launch.py --config=configs/dapo_qwen25_32b.py:hf_path=gs://BUCKET/Qwen2.5-32B \
      --backend=tpu-pod --tpu_name=dapo --zone=us-east5-a --accelerator_type=v5p-128 \
      --queued_resource --capacity=spot --setup --workdir=gs://BUCKET/dapo32b --dry_run

Each run gets its own directory <workdir>/<run name> (local, or in a bucket: gs://...), holding
metrics.jsonl, checkpoints and results.json; the local backends log to <run dir>/log.txt (a
bucket's runs log under ./launch_logs/ and the log is copied beside the run). Re-running a launch
skips runs that finished and resumes (--resume) runs that have a checkpoint; a config file
without get_sweep() is one run named "run".

tpu-pod and xpk check first that every distinct run fits the slice (python -m dapo_jax.aot on
this CPU machine, for --accelerator_type or --topology), also in a dry run; --skip_fit_check
launches unchecked; with --fit_search a refusal names the smallest larger slice that fits. --queued_resource asks for the slice and waits for ACTIVE; --setup puts this
commit's tree and a Python >= 3.11 environment with requirements-tpu.txt on every worker. A
pod's run starts detached on every worker (its own session: a dropped ssh or a sleeping laptop
does not stop it) and the launcher follows it through its workdir; the runs go one after
another, and a preempted run stops the sweep (the next launch resumes it). --action=status
reads every run's state from its workdir, from any machine; --action=stop sends its processes
SIGTERM (they save at the end of the step).

A campaign kept over several launches (local backends): --results_dir=DIR skips every run whose
results.json is in DIR/<run name>/ and copies each finished run's small logs there (top-level
files up to 1 MiB, never checkpoints; a failed run's too, without a results.json, so a later
launch runs it again); --stop_at (with --run_minutes) starts no run that could
not finish by then:

  python experiments/launch.py --config=configs/ladder.py --sweep=testbed_confirm \
      --workdir=runs/testbed_confirm --results_dir=experiments/results/testbed_confirm \
      --parallel=2 --stop_at=12:45 --run_minutes=4

The launch ends with one line per run, read from this launch's own output and the run's
state.json: finished, preempted (how to resume), failed (the run's last `error:` line, or the
signal that killed it), skipped or not started; exit status 1 when any run did not finish. A
refusal of the launch itself ends with one `error: ...` line (exit status 2).
"""
import argparse
import os
import shlex
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import launch_detached  # noqa: E402
import launch_local as local_backend  # noqa: E402
import launch_pod  # noqa: E402
from launch_local import launch_local, local_commands, multihost_commands  # noqa: E402,F401
from launch_pod import Pod, aot_check, aot_key, tpu_pod_command  # noqa: E402,F401  (API)
from launch_runs import (REPO, LaunchError, Outcome, RunSpec, expand,  # noqa: E402,F401
                         load_module, outcome, summarise, summary_row)
import launch_runs  # noqa: E402
from dapo_jax.workdir import paths, run_state  # noqa: E402

QR_POLL_S = 30.0  # seconds between two looks at a queued resource's state


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one `error:` line, like every other refusal of the launch
    raise LaunchError(message)


def _flags() -> argparse.ArgumentParser:
  ap = _Parser(description=__doc__.split("\n")[0])
  add = ap.add_argument
  add("--config", required=True, help="configs/*.py (with get_config / get_sweep)")
  add("--action", choices=("launch", "status", "stop"), default="launch", help="status: each "
      "run's state read from its workdir (from any machine); stop: SIGTERM to its processes")
  add("--sweep", default=None, help="argument to the config's get_sweep()")
  add("--backend", choices=("local", "multihost", "tpu-pod", "xpk"), default="local")
  add("--workdir", required=True, help="root directory (local or gs://...); one per run below")
  add("--parallel", type=int, default=1, help="local: runs at once")
  add("--results_dir", default="", help="local / multihost: skip runs whose results.json is in "
      "DIR/<run name>/ and copy each finished (or failed) run's small logs there (never "
      "checkpoints)")
  add("--stop_at", default="", help="local / multihost: start no run that cannot finish by "
      "then: HH:MM (today, local time), an ISO date-time, or +MINUTES from now")
  add("--run_minutes", type=float, default=None, help="--stop_at: how long one run takes; "
      "the longest run this launch finished counts too")
  add("--num_processes", type=int, default=2, help="multihost: processes per run")
  add("--devices_per_process", type=int, default=4, help="multihost: CPU devices")
  add("--only", default="", help="comma-separated run names to launch (default all)")
  add("--set", action="append", default=[], metavar="FIELD=VALUE",
      help="config override for every run (e.g. checkpoint.export_hf=False); repeat")
  add("--dry_run", action="store_true", help="print the commands (the fit check still runs)")
  add("--tpu_name", default="", help="tpu-pod: the TPU VM (and its queued resource) name")
  add("--zone", default="", help="tpu-pod / xpk: the zone")
  add("--project", default="", help="tpu-pod / xpk: GCP project (default: gcloud's)")
  add("--repo_dir", default="~/dapo_jax", help="tpu-pod: the repo on each worker (~ expands)")
  add("--accelerator_type", default="", help="tpu-pod / xpk: the slice, e.g. v5p-128")
  add("--topology", default="", help="the fit check's slice when it differs in name only "
      "(v5e-16 for v5litepod-16); default: from --accelerator_type")
  add("--skip_fit_check", action="store_true", help="tpu-pod / xpk: launch unchecked")
  add("--fit_search", action="store_true", help="tpu-pod / xpk: a run that does not fit is "
      "compiled for the larger slices of the generation; the refusal names the smallest")
  add("--setup", action="store_true", help="tpu-pod: this commit's tree and "
      "requirements-tpu.txt on every worker first (idempotent)")
  add("--queued_resource", action="store_true", help="tpu-pod: ask for the slice first "
      "(gcloud ... queued-resources create) and wait until it is ACTIVE")
  add("--capacity", choices=("on-demand", "spot", "reserved"), default="on-demand",
      help="tpu-pod --queued_resource: how the slice is granted")
  add("--runtime_version", default="", help="tpu-pod --queued_resource: TPU VM software "
      "(default by generation, launch_pod.RUNTIME_VERSIONS)")
  add("--cluster", default="", help="xpk: the GKE cluster")
  add("--base_docker_image", default="python:3.11", help="xpk: the image the repo is added to")
  add("--max_restarts", type=int, default=3, help="xpk: restarts after a failure or "
      "preemption (each resumes from the newest checkpoint)")
  add("--grace_s", type=int, default=3600, help="xpk: seconds from a stop signal to the kill: "
      "the rest of a step plus a save (a run logs time_step_s; docs/scale.md estimates the 32B "
      "step)")
  return ap


def parse(argv) -> argparse.Namespace:
  """The flags, checked against each other (LaunchError names the flag)."""
  args = _flags().parse_args(argv)
  if args.parallel < 1:
    raise LaunchError("--parallel: must be >= 1")
  if args.grace_s < 1:
    raise LaunchError(f"--grace_s: must be >= 1 (seconds), got {args.grace_s}")
  pod = args.backend in ("tpu-pod", "xpk")
  if args.backend == "tpu-pod" and not (args.tpu_name and args.zone):
    raise LaunchError("--backend=tpu-pod needs --tpu_name and --zone")
  if args.backend == "xpk" and not (args.cluster and args.accelerator_type):
    raise LaunchError("--backend=xpk needs --cluster and --accelerator_type (e.g. v5p-128)")
  if args.queued_resource and not args.accelerator_type:
    raise LaunchError("--queued_resource needs --accelerator_type (e.g. v5p-128)")
  if (args.setup or args.queued_resource) and args.backend != "tpu-pod":
    raise LaunchError("--setup and --queued_resource are for --backend=tpu-pod")
  if args.accelerator_type:
    implied = launch_pod.topology_of(args.accelerator_type)
    if args.topology and args.topology != implied:
      raise LaunchError(f"--topology={args.topology} and --accelerator_type="
                        f"{args.accelerator_type} (= {implied}) name different slices")
    args.topology = implied
  if pod and not (args.topology or args.skip_fit_check):
    raise LaunchError(f"--backend={args.backend}: the fit check needs the slice: give "
                      f"--accelerator_type (e.g. v5p-128) or --topology, or --skip_fit_check "
                      f"to launch without it")
  args.workdir = _workdir(args.workdir, pod)
  if (args.results_dir or args.stop_at) and pod:
    raise LaunchError(f"--results_dir and --stop_at are for the local backends, not "
                      f"--backend={args.backend}")
  args.results_dir = os.path.abspath(args.results_dir) if args.results_dir else ""
  args.stop_at = local_backend.deadline(args.stop_at, args.run_minutes) if args.stop_at else None
  return args


def _workdir(workdir: str, pod: bool) -> str:
  """A URL stays a URL; a pod's local path must be absolute (the same on every worker)."""
  if paths.is_url(workdir):
    return workdir.rstrip("/")
  if pod:
    if not os.path.isabs(workdir):
      raise LaunchError(f"--workdir={workdir}: a pod's runs need a bucket (gs://...) or an "
                        f"absolute path that every worker mounts")
    print(f"note: --workdir={workdir} is a path on each worker: it must be one file system "
          f"every worker mounts (NFS, Filestore, gcsfuse); gs://BUCKET/... needs nothing "
          f"mounted", file=sys.stderr)
    return workdir.rstrip("/")
  return os.path.abspath(workdir)


def runs_of(args) -> list[RunSpec]:
  runs = expand(args.config, args.sweep, args.workdir)
  launch_runs.apply_sets(runs, args.set)
  runs = launch_runs.select(runs, args.only)
  if args.dry_run and paths.is_url(args.workdir):
    print(f"note: a dry run does not read {args.workdir}: the commands are those of new runs "
          f"(a launch adds --resume to each run with a checkpoint there)", file=sys.stderr)
    for run in runs:
      run.read_state = False
  return runs


def _show(cmd: list[str]) -> None:
  print(" ".join(shlex.quote(c) for c in cmd), flush=True)


def _run(cmd: list[str], *, dry: bool, capture: bool = False) -> str:
  """Prints `cmd`; unless `dry`, runs it (LaunchError if it fails) and returns its stdout."""
  _show(cmd)
  if dry:
    return ""
  p = subprocess.run(cmd, capture_output=capture, text=True, check=False)
  if p.returncode != 0:
    raise LaunchError(f"{cmd[0]} {cmd[1] if len(cmd) > 1 else ''} ... failed with exit "
                      f"{p.returncode}: {(p.stderr or '').strip()[-300:]}")
  return p.stdout or ""


def get_slice(args, pod: Pod) -> None:
  """--queued_resource: asks for the slice unless it is there (a failed or preempted request
  is deleted and asked for again), then waits for ACTIVE."""
  state_cmd = launch_pod.queued_resource_state(pod)
  state = "" if args.dry_run else _state(state_cmd)
  if state in launch_pod.FAILED_STATES:
    _run(launch_pod.queued_resource_delete(pod), dry=False)
  if state in ("", *launch_pod.FAILED_STATES):
    _run(launch_pod.queued_resource_create(
        pod, accelerator_type=args.accelerator_type, capacity=args.capacity,
        runtime=launch_pod.runtime_version(args.accelerator_type, args.runtime_version)),
         dry=args.dry_run)
  _show(state_cmd)  # polled until it prints ACTIVE
  while not args.dry_run and state != launch_pod.ACTIVE:
    time.sleep(QR_POLL_S)
    state = _state(state_cmd)
    print(f"[slice] {pod.tpu_name}: {state or 'not found'}", flush=True)
    if state in launch_pod.FAILED_STATES:
      raise LaunchError(f"queued resource {pod.tpu_name} is {state} (no capacity granted): "
                        f"rerun the launch to ask again, or try --capacity / another zone")


def _state(cmd: list[str]) -> str:
  p = subprocess.run(cmd, capture_output=True, text=True, check=False)
  return p.stdout.strip() if p.returncode == 0 else ""


def setup_workers(args, pod: Pod) -> None:
  sha, dirty = launch_pod.repo_commit()
  if dirty:
    print(f"note: the working tree has uncommitted changes; the workers get commit {sha[:12]} "
          f"without them", file=sys.stderr)
  for cmd in launch_pod.setup_commands(pod, sha):
    _run(cmd, dry=args.dry_run)


def launch_pod_runs(args, runs: list[RunSpec]) -> dict:
  """tpu-pod: the slice and workers (if asked), then each run started detached on every worker
  and followed through its workdir, in turn (the launcher may go away: --action=status reads
  the run later, from any machine)."""
  pod = Pod(args.tpu_name, args.zone, args.project, args.repo_dir)
  if args.queued_resource:
    get_slice(args, pod)
  if args.setup:
    setup_workers(args, pod)
  outcomes = {}
  for i, run in enumerate(runs):
    _run(tpu_pod_command(run, pod, launch_id=args.launch_id), dry=args.dry_run)
    if args.dry_run:
      continue
    hint = (f"see the workers' logs: {' '.join(pod.gcloud('tpu-vm ssh', pod.tpu_name))} "
            f"--worker=0 --command='tail -n 30 {pod.log_dir}/{run.name}.*.log'")
    outcomes[run.name] = launch_detached.follow(run, args.launch_id, log_hint=hint)
    if outcomes[run.name].state == "preempted":  # the slice may be gone: the rest waits
      outcomes.update({r.name: Outcome("not started", "after a preemption; rerun the launch")
                       for r in runs[i + 1:]})
      break
  return outcomes


def act(args, runs: list[RunSpec]) -> int:
  """--action=status or stop."""
  if args.action == "status":
    return launch_detached.status(runs)
  if args.backend == "xpk":
    raise LaunchError("--action=stop: stop an xpk workload with xpk workload delete "
                      f"--cluster={args.cluster} --workload=<name>")
  if args.backend != "tpu-pod":
    return launch_detached.stop_local(runs)
  pod = Pod(args.tpu_name, args.zone, args.project, args.repo_dir)
  for run in runs:
    _run(pod.gcloud("tpu-vm ssh", pod.tpu_name, flags=(
        "--worker=all", f"--command={launch_detached.pod_stop_script(run)}")), dry=args.dry_run)
  return 0


def launch_xpk(args, runs: list[RunSpec]) -> dict:
  outcomes = {}
  for run in runs:
    cmd = launch_pod.xpk_command(
        run, cluster=args.cluster, accelerator_type=args.accelerator_type,
        image=args.base_docker_image, zone=args.zone, project=args.project,
        max_restarts=args.max_restarts, grace_s=args.grace_s)
    _run(cmd, dry=args.dry_run)
    outcomes[run.name] = Outcome("submitted", f"xpk workload list --cluster={args.cluster} "
                                 f"shows {launch_pod.workload_name(run)}; rerun the launch "
                                 f"to read its results")
  return {} if args.dry_run else outcomes


def _say_skipped(args, runs: list[RunSpec], todo: list[RunSpec]) -> None:
  """How many runs finished before (results.json in their directory) and are not run again."""
  resumed = sum(r.status() == "resumable" for r in todo)
  where = args.workdir + (f" or {args.results_dir}" if args.results_dir else "")
  print(f"[launch] skipped {len(runs) - len(todo)} finished run(s) (results.json in "
        f"{where}); {len(todo)} to run, {resumed} of them resumed", flush=True,
        file=sys.stderr if args.dry_run else sys.stdout)  # a dry run's stdout: commands only


def main(argv=None) -> int:
  """parse -> expand -> check -> launch -> summarise. A refusal: one `error:` line, exit 2."""
  try:
    args = parse(argv)
    runs = runs_of(args)
    if args.action != "launch":
      return act(args, runs)
    args.launch_id = os.environ[run_state.LAUNCH_ENV] = f"{time.time():.0f}-{os.getpid()}"
    launch_pod.fit_check(args, runs)
    if not args.dry_run:
      local_backend.collect_finished(runs, args.results_dir)
    todo = [r for r in runs if r.status() != "finished"
            and not launch_runs.in_results(r, args.results_dir)]
    _say_skipped(args, runs, todo)
    launcher = {"tpu-pod": launch_pod_runs, "xpk": launch_xpk}.get(args.backend, launch_local)
    outcomes = launcher(args, todo)
  except (LaunchError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    sys.exit(2)
  if args.dry_run:
    return 0
  skipped = {r.name: Outcome("skipped", "finished before") for r in runs if r not in todo}
  return summarise(runs, outcomes | skipped)


if __name__ == "__main__":
  sys.exit(main())
