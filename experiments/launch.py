"""Expands a config's sweep into runs and launches them.

  python experiments/launch.py --config=configs/ladder.py --sweep=ladder --backend=local \
      --workdir=runs/ladder --parallel=1
  python experiments/launch.py --config=configs/ladder.py --sweep=eps_high --backend=multihost \
      --num_processes=2 --workdir=runs/eps
  python experiments/launch.py --config=configs/dapo_qwen25_32b.py --backend=tpu-pod \
      --tpu_name=my-v5p-128 --zone=us-east5-a --workdir=/nfs/runs/dapo32b --dry_run
  # without --dry_run: --topology=v5p-128 compiles every distinct run for the slice first
  # (python -m dapo_jax.aot) and refuses one that does not fit; --skip_aot_check skips that

Each run gets its own directory <workdir>/<run name> with log.txt, metrics.jsonl, checkpoints and
results.json. Re-running a sweep skips runs that have results.json and resumes (--resume) runs
that have a checkpoint. A config file without get_sweep() is one run named "run".
A one-line-per-run summary table is printed at the end.
"""
import argparse
import dataclasses
import importlib.util
import json
import os
import shlex
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from dapo_jax.train import checkpoint_dirs  # noqa: E402  (stdlib only; no JAX in the launcher)


@dataclasses.dataclass
class RunSpec:
  name: str
  config_arg: str        # "configs/x.py" or "configs/x.py:a=1"
  overrides: dict
  workdir: str

  def status(self) -> str:
    if os.path.exists(os.path.join(self.workdir, "results.json")):
      return "done"
    if checkpoint_dirs.latest(os.path.join(self.workdir, "checkpoints")) is not None:
      return "interrupted"
    return "new"

  def argv(self, python: str = sys.executable) -> list[str]:
    cmd = [python, "-m", "dapo_jax.main", f"--config={self.config_arg}",
           f"--workdir={self.workdir}"]
    cmd += [f"--config.{k}={v}" for k, v in self.overrides.items()]
    if self.status() == "interrupted":
      cmd.append("--resume")
    return cmd


def load_module(path: str):
  spec = importlib.util.spec_from_file_location("sweep_config", os.path.join(REPO, path)
                                                if not os.path.isabs(path) else path)
  if spec is None or spec.loader is None:
    raise ValueError(f"--config: cannot load {path!r}")
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  spec.loader.exec_module(module)
  return module


def expand(config_arg: str, sweep: str | None, workdir: str) -> list[RunSpec]:
  """`config_arg` is "file.py" or "file.py:arg", as dapo_jax.main's --config takes it."""
  config_path, _, user_arg = config_arg.partition(":")
  module = load_module(config_path)
  if not hasattr(module, "get_sweep"):
    if sweep:
      raise ValueError(f"--sweep: {config_path} defines no get_sweep()")
    module.get_config(user_arg or None)  # a bad argument fails here, before launching
    return [RunSpec("run", config_arg, {}, os.path.join(workdir, "run"))]
  runs = []
  for r in module.get_sweep(sweep):
    both = {kv.split("=")[0] for kv in r["arg"].split(",") if kv} & \
        {kv.split("=")[0] for kv in user_arg.split(",") if kv}
    if both:
      raise ValueError(f"--config={config_arg}: sweep {sweep!r} run {r['name']!r} sets "
                       f"{sorted(both)} itself ({r['arg']!r})")
    r_arg = ",".join(a for a in (r["arg"], user_arg) if a)  # the sweep's, then the file's
    module.get_config(r_arg or None)  # fail here, before launching, on a bad sweep entry
    arg = f"{config_path}:{r_arg}" if r_arg else config_path
    runs.append(RunSpec(r["name"], arg, dict(r["overrides"]), os.path.join(workdir, r["name"])))
  names = [r.name for r in runs]
  if len(set(names)) != len(names):
    raise ValueError(f"{config_path}: get_sweep({sweep!r}) has duplicate run names")
  return runs


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


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


def tpu_pod_command(run: RunSpec, *, tpu_name: str, zone: str, project: str,
                    repo_dir: str) -> list[str]:
  """The gcloud command that runs this run's main on every worker of a Cloud TPU VM pod."""
  inner = " ".join(shlex.quote(a) for a in run.argv(python="python3"))
  cmd = ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu_name, f"--zone={zone}",
         "--worker=all", f"--command=cd {repo_dir} && {inner}"]
  if project:
    cmd.insert(5, f"--project={project}")
  return cmd


# Overrides that change no compiled shape or buffer: runs differing only in these share one
# ahead-of-time check (an eps_high sweep compiles once; a max_new_tokens sweep does not).
_AOT_NEUTRAL = ("seed", "algo.eps_low", "algo.eps_high", "algo.clip_c", "algo.overlong_cache_len",
                "algo.overlong_factor", "algo.overlong_penalty", "algo.overlong_filter",
                "rollout.temperature", "rollout.top_p", "rollout.top_k", "train.num_steps",
                "optim.", "eval.", "checkpoint.", "log.", "distributed.")


def aot_key(run: RunSpec) -> tuple:
  kept = {k: v for k, v in run.overrides.items() if not k.startswith(_AOT_NEUTRAL)}
  return (run.config_arg, tuple(sorted((k, str(v)) for k, v in kept.items())))


def aot_check(runs: list, topology: str) -> list[str]:
  """Compiles each distinct run for the slice (python -m dapo_jax.aot); returns the names of
  runs that do not fit (or whose check failed)."""
  groups: dict = {}
  for run in runs:
    groups.setdefault(aot_key(run), []).append(run)
  misfits = []
  for (config_arg, kept), members in groups.items():
    cmd = [sys.executable, "-m", "dapo_jax.aot", f"--config={config_arg}",
           f"--topology={topology}"] + [f"--config.{k}={v}" for k, v in kept]
    print(f"[aot] {', '.join(r.name for r in members)}: {' '.join(map(shlex.quote, cmd))}",
          flush=True)
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    p = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    print("\n".join(l for l in p.stdout.splitlines() if not l.startswith("[aot] ")))
    if p.returncode not in (0, 1):  # failed before a verdict (a bad config, no libtpu)
      print((p.stderr.strip().splitlines() or ["the check failed"])[-1])
    if p.returncode != 0:
      misfits += [r.name for r in members]
  return misfits


def _launch(cmds, log_path):
  os.makedirs(os.path.dirname(log_path), exist_ok=True)
  procs = []
  for i, (argv, env) in enumerate(cmds):
    path = log_path if i == 0 else log_path.replace(".txt", f".p{i}.txt")
    f = open(path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    procs.append((subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT),
                  f))
  return procs


def _summary_row(run: RunSpec, status: str, wall: float | None) -> str:
  res = os.path.join(run.workdir, "results.json")
  before = after = "-"
  steps = "-"
  if os.path.exists(res):
    with open(res, encoding="utf-8") as f:
      r = json.load(f)
    key = next((k for k in r.get("after", {}) if k.startswith("avg@") and "_ci" not in k), None)
    if key:
      after = f"{key} {100 * r['after'][key]:.1f}"
      if "before" in r:
        before = f"{100 * r['before'][key]:.1f}"
    steps = str(r.get("steps", "-"))
  w = f"{wall:.0f}s" if wall is not None else "-"
  return f"{run.name:<28} {status:<12} steps {steps:>5}  before {before:>6}  after {after:>14}  {w}"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", required=True, help="configs/*.py (with get_config / get_sweep)")
  ap.add_argument("--sweep", default=None, help="argument to the config's get_sweep()")
  ap.add_argument("--backend", choices=("local", "multihost", "tpu-pod"), default="local")
  ap.add_argument("--workdir", required=True, help="root directory; one sub-directory per run")
  ap.add_argument("--parallel", type=int, default=1, help="local: runs at once")
  ap.add_argument("--num_processes", type=int, default=2, help="multihost: processes per run")
  ap.add_argument("--devices_per_process", type=int, default=4, help="multihost: CPU devices")
  ap.add_argument("--tpu_name", default="", help="tpu-pod: the TPU VM name")
  ap.add_argument("--zone", default="", help="tpu-pod: its zone")
  ap.add_argument("--project", default="", help="tpu-pod: GCP project (default: gcloud's)")
  ap.add_argument("--repo_dir", default="~/dapo_jax",
                  help="tpu-pod: repo path on the workers (used unquoted, so ~ expands)")
  ap.add_argument("--only", default="", help="comma-separated run names to launch (default all)")
  ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                  help="config override for every run (e.g. checkpoint.export_hf=False); repeat")
  ap.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  ap.add_argument("--topology", default="",
                  help="tpu-pod: the slice, e.g. v5p-128; each run is compiled for it first "
                       "(python -m dapo_jax.aot) and a run that does not fit is not launched")
  ap.add_argument("--skip_aot_check", action="store_true",
                  help="tpu-pod: launch without the ahead-of-time fit check")
  args = ap.parse_args(argv)
  if args.parallel < 1:
    ap.error("--parallel must be >= 1")
  if args.backend == "tpu-pod" and not (args.tpu_name and args.zone):
    ap.error("--backend=tpu-pod needs --tpu_name and --zone")
  if (args.backend == "tpu-pod" and not args.dry_run and not args.skip_aot_check
      and not args.topology):
    ap.error("--backend=tpu-pod needs --topology (e.g. v5p-128) for the fit check, or "
             "--skip_aot_check")

  workdir = os.path.abspath(args.workdir)
  runs = expand(args.config, args.sweep, workdir)
  for item in args.set:
    if "=" not in item:
      ap.error(f"--set: expected FIELD=VALUE, got {item!r}")
    key, value = item.split("=", 1)
    for run in runs:  # a sweep's own value for the field wins
      run.overrides.setdefault(key, value)
  if args.only:
    wanted = set(args.only.split(","))
    unknown = wanted - {r.name for r in runs}
    if unknown:
      ap.error(f"--only: unknown run names {sorted(unknown)}")
    runs = [r for r in runs if r.name in wanted]

  rows, pending = {}, []
  for run in runs:
    if run.status() == "done":
      rows[run.name] = _summary_row(run, "skipped", None)
    else:
      pending.append(run)
  resume = sum(r.status() == "interrupted" for r in pending)
  print(f"[launch] skipped {len(runs) - len(pending)} finished run(s) (results.json in "
        f"{workdir}); {len(pending)} to run, {resume} of them resumed", flush=True,
        file=sys.stderr if args.dry_run else sys.stdout)  # a dry run's stdout: commands only

  if args.backend == "tpu-pod":
    if not (args.dry_run or args.skip_aot_check):
      misfits = aot_check(pending, args.topology)
      if misfits:
        print(f"[aot] refusing to launch: {', '.join(misfits)} do(es) not fit "
              f"{args.topology} (see the tables above; --skip_aot_check launches anyway)")
        return 1
    for run in pending:
      cmd = tpu_pod_command(run, tpu_name=args.tpu_name, zone=args.zone, project=args.project,
                            repo_dir=args.repo_dir)
      print(" ".join(shlex.quote(c) for c in cmd))
      if not args.dry_run:
        subprocess.run(cmd, check=True)
        rows[run.name] = _summary_row(run, "launched", None)
    if args.dry_run:
      return 0
  else:
    make = (local_commands if args.backend == "local" else
            lambda r: multihost_commands(r, args.num_processes, args.devices_per_process))
    if args.dry_run:
      for run in pending:
        for argv_, _ in make(run):
          print(" ".join(shlex.quote(a) for a in argv_))
      return 0
    width = args.parallel if args.backend == "local" else 1
    queue, live = list(pending), []
    while queue or live:
      while queue and len(live) < width:
        run = queue.pop(0)
        print(f"[launch] {run.name} ({run.status()}) -> {run.workdir}", flush=True)
        live.append((run, _launch(make(run), os.path.join(run.workdir, "log.txt")), time.time()))
      time.sleep(0.5)
      for item in list(live):
        run, procs, t0 = item
        if all(p.poll() is not None for p, _ in procs):
          for _, f in procs:
            f.close()
          ok = all(p.returncode == 0 for p, _ in procs)
          rows[run.name] = _summary_row(run, "done" if ok else
                                        f"failed({procs[0][0].returncode})", time.time() - t0)
          print(f"[launch] {rows[run.name]}", flush=True)
          live.remove(item)
  print("\n== summary ==")
  for run in runs:
    print(rows.get(run.name, _summary_row(run, run.status(), None)))
  return 0 if all("failed" not in r for r in rows.values()) else 1


if __name__ == "__main__":
  sys.exit(main())
