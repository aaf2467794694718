"""The runs of a launch: a config's sweep expanded into RunSpecs, and each run's state.

A run's state is read from its workdir (local or a bucket, through dapo_jax.workdir.paths) and, once it
ran, from its exit status and the last `error:` line of its output:

  finished   results.json written
  preempted  stopped with its work saved (a stop signal: exit 75 after a checkpoint, and
             state.json says so; or killed by SIGTERM before it could save): rerunning the
             launch resumes it
  failed     any other exit: the exit status and the run's last `error:` line (or the signal
             that killed it)
  new / resumable   before a launch: no checkpoint yet / a checkpoint to resume
  not started       a pod's runs after a preemption (the slice is gone)
"""
import dataclasses
import importlib.util
import json
import os
import signal
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from dapo_jax.workdir import paths, run_state  # noqa: E402  (etils only: no JAX in the launcher)
from dapo_jax.train import checkpoint_dirs  # noqa: E402


class LaunchError(ValueError):
  """A launch that cannot go on; the message names the flag or file and what to do."""


@dataclasses.dataclass
class RunSpec:
  name: str
  config_arg: str        # "configs/x.py" or "configs/x.py:a=1"
  overrides: dict
  workdir: str           # a local absolute path or a URL (gs://...)
  read_state: bool = True  # False: a dry run does not read a bucket (offline, no credentials)

  def checkpoint(self) -> int | None:
    return checkpoint_dirs.latest(f"{self.workdir}/checkpoints")

  def results(self) -> dict | None:
    path = paths.resolve(self.workdir) / "results.json"
    if not path.exists():
      return None
    try:
      return json.loads(path.read_text())
    except ValueError as e:
      raise LaunchError(f"{path}: not valid JSON ({e}); move it aside to run {self.name} "
                        f"again") from None

  def status(self) -> str:
    """Before a launch: finished, resumable (a checkpoint), new, or unread (not looked at)."""
    if not self.read_state:
      return "unread"
    if self.results() is not None:
      return "finished"
    return "resumable" if self.checkpoint() is not None else "new"

  def argv(self, python: str = sys.executable) -> list[str]:
    cmd = [python, "-m", "dapo_jax.main", f"--config={self.config_arg}",
           f"--workdir={self.workdir}"]
    cmd += [f"--config.{k}={v}" for k, v in self.overrides.items()]
    if self.status() == "resumable":
      cmd.append("--resume")
    return cmd


def load_module(path: str):
  """The config file as a module; LaunchError naming the path when there is none."""
  full = path if os.path.isabs(path) else os.path.join(REPO, path)
  if not os.path.isfile(full):
    raise LaunchError(f"--config: no such file {path} (looked for {full}; a path relative to "
                      f"the repo, e.g. configs/tiny_cpu.py)")
  spec = importlib.util.spec_from_file_location("sweep_config", full)
  module = importlib.util.module_from_spec(spec)
  sys.path.insert(0, REPO)
  spec.loader.exec_module(module)
  return module


def _keys(arg: str) -> set[str]:
  return {kv.split("=")[0] for kv in arg.split(",") if kv}


def expand(config_arg: str, sweep: str | None, workdir: str) -> list[RunSpec]:
  """`config_arg` is "file.py" or "file.py:arg", as dapo_jax.main's --config takes it."""
  config_path, _, user_arg = config_arg.partition(":")
  module = load_module(config_path)
  if not hasattr(module, "get_sweep"):
    if sweep:
      raise LaunchError(f"--sweep={sweep}: {config_path} defines no get_sweep(), so it is one "
                        f"run: drop --sweep (sweeps live in configs such as configs/ladder.py)")
    module.get_config(user_arg or None)  # a bad argument fails here, before launching
    return [RunSpec("run", config_arg, {}, f"{workdir}/run")]
  runs = []
  for r in module.get_sweep(sweep):
    both = _keys(r["arg"]) & _keys(user_arg)
    if both:
      raise LaunchError(_clash_message(config_arg, sweep, module, both))
    r_arg = ",".join(a for a in (r["arg"], user_arg) if a)  # the sweep's, then the file's
    module.get_config(r_arg or None)  # fail here, before launching, on a bad sweep entry
    arg = f"{config_path}:{r_arg}" if r_arg else config_path
    runs.append(RunSpec(r["name"], arg, dict(r["overrides"]), f"{workdir}/{r['name']}"))
  names = [r.name for r in runs]
  if len(set(names)) != len(names):
    raise LaunchError(f"{config_path}: get_sweep({sweep!r}) has duplicate run names")
  return runs


def _clash_message(config_arg: str, sweep, module, keys: set[str]) -> str:
  """A file argument that the sweep sets itself: how to launch what was meant instead."""
  path, _, user_arg = config_arg.partition(":")
  wanted = dict(kv.split("=", 1) for kv in user_arg.split(",") if "=" in kv)
  match = [r["name"] for r in module.get_sweep(sweep)
           if all(dict(kv.split("=", 1) for kv in r["arg"].split(",") if "=" in kv).get(k)
                  == wanted[k] for k in keys)]
  sweep_flag = f" --sweep={sweep}" if sweep else ""
  runs = (f"--config={path}{sweep_flag} --only={','.join(match)}" if match else
          f"--config={path}{sweep_flag} --only=<run names>")
  return (f"--config={config_arg}: the {repr(sweep) if sweep else 'default'} sweep of {path} "
          f"sets {sorted(keys)} in each of its runs, so the file argument cannot. Launch the "
          f"runs you mean with {runs}, or run the config directly: python -m dapo_jax.main "
          f"--config={config_arg} --workdir=DIR")


def apply_sets(runs: list[RunSpec], sets: list[str]) -> None:
  """--set FIELD=VALUE for every run (a sweep's own value for the field wins)."""
  for item in sets:
    if "=" not in item:
      raise LaunchError(f"--set: expected FIELD=VALUE, got {item!r}")
    key, value = item.split("=", 1)
    for run in runs:
      run.overrides.setdefault(key, value)


def select(runs: list[RunSpec], only: str) -> list[RunSpec]:
  if not only:
    return runs
  wanted = set(only.split(","))
  unknown = wanted - {r.name for r in runs}
  if unknown:
    raise LaunchError(f"--only: unknown run names {sorted(unknown)}; the sweep's runs are "
                      f"{[r.name for r in runs][:12]}")
  return [r for r in runs if r.name in wanted]


@dataclasses.dataclass
class Outcome:
  state: str         # finished | preempted | failed | skipped | not started | submitted
  detail: str = ""   # how to resume, or the exit status and the last error line
  wall_s: float | None = None


def last_error(lines: list[str]) -> str | None:
  return next((ln.strip() for ln in reversed(lines) if ln.strip().startswith("error:")), None)


def outcome(run: RunSpec, returncode: int, lines: list[str], *, wall_s: float,
            launch_id: str = "") -> Outcome:
  """The state of `run` after its process ended with `returncode`, `lines` being this launch's
  output only: the run's own record (state.json) where this launch wrote it, else the exit
  status (75 or SIGTERM: preempted; another signal named) and the last `error:` line."""
  if run.results() is not None:
    return Outcome("finished", "", wall_s)
  rec = run_state.read(run.workdir) if run.read_state else None
  ours = rec is not None and launch_id and rec.get("launch") == launch_id
  error = last_error(lines) or (rec.get("error") if ours else None)
  if ours and rec["state"] in ("preempted", "interrupted") or error is None and returncode in (
      0, run_state.PREEMPTED_EXIT, -15, 143):
    step = run.checkpoint()
    how = (f"saved at step {step}; rerun the same launch to resume it (--resume)"
           if step is not None else "no checkpoint yet; rerun the same launch to start it again")
    return Outcome("preempted", how, wall_s)
  if returncode < 0 and error is None:
    try:
      error = f"killed by {signal.Signals(-returncode).name}"
    except ValueError:
      error = f"killed by signal {-returncode}"
  last = error or next((ln.strip() for ln in reversed(lines) if ln.strip()), "(no output)")
  return Outcome("failed", f"exit {returncode}: {last}", wall_s)


def summary_row(run: RunSpec, out: Outcome) -> str:
  r = run.results() or {}
  before = after = "-"
  key = next((k for k in r.get("after", {}) if k.startswith("avg@") and "_ci" not in k), None)
  if key:
    after = f"{key} {100 * r['after'][key]:.1f}"
    if "before" in r:
      before = f"{100 * r['before'][key]:.1f}"
  steps = str(r.get("steps", "-"))
  wall = f"{out.wall_s:.0f}s" if out.wall_s is not None else "-"
  row = (f"{run.name:<28} {out.state:<11} steps {steps:>5}  before {before:>6}  after "
         f"{after:>14}  {wall:>6}")
  return row + (f"  {out.detail}" if out.detail else "")


def summarise(runs: list[RunSpec], outcomes: dict) -> int:
  """One line per run; 1 if any run did not finish (a submitted xpk workload counts as done)."""
  print("\n== summary ==")
  for run in runs:
    print(summary_row(run, outcomes[run.name]))
  done = ("finished", "skipped", "submitted")
  return 0 if all(outcomes[r.name].state in done for r in runs) else 1


def log_path(run: RunSpec) -> str:
  """Local: <run dir>/log.txt; a bucket's run: ./launch_logs/<bucket path>/log.txt."""
  if not paths.is_url(run.workdir):
    return os.path.join(run.workdir, "log.txt")
  return os.path.abspath(os.path.join("launch_logs", run.workdir.split("://", 1)[1], "log.txt"))


def copy_log(run: RunSpec) -> None:
  if paths.is_url(run.workdir):
    try:
      paths.copy_file(log_path(run), f"{run.workdir}/launch_log.txt")
    except OSError as e:
      print(f"note: could not copy the log to {run.workdir}: {e}", file=sys.stderr)


SMALL_LOG_BYTES = 1 << 20  # --results_dir: a run's top-level files up to this size are its logs


def in_results(run: RunSpec, results_dir: str | None) -> bool:
  """--results_dir: the run's results.json is there (it finished and its logs were copied)."""
  return bool(results_dir) and os.path.isfile(os.path.join(results_dir, run.name, "results.json"))


def copy_small_logs(run: RunSpec, results_dir: str, *, failed: bool = False) -> list[str]:
  """A finished run's small logs into <results_dir>/<run name>/: the files at the top of its
  directory up to SMALL_LOG_BYTES (results.json, metrics.jsonl, config.json, log.txt), never a
  folder (checkpoints, export, tensorboard). results.json is copied last, so a copy cut short
  is not taken for a finished one. failed: a run that failed has no results.json; its logs are
  kept as evidence (a collapse, a refusal) and a later launch still runs it. Returns the names
  copied."""
  src = paths.resolve(run.workdir)
  if not failed and not (src / "results.json").exists():
    raise LaunchError(f"--results_dir: {run.workdir} has no results.json to copy")
  dst = os.path.join(results_dir, run.name)
  os.makedirs(dst, exist_ok=True)
  names = sorted(p.name for p in src.iterdir()
                 if p.is_file() and p.stat().length <= SMALL_LOG_BYTES and p.name != "run.lock")
  names = [n for n in names if n != "results.json"] + ([] if failed else ["results.json"])
  for stale in set(os.listdir(dst)) - set(names):  # an earlier, failed attempt's (errors.log)
    if os.path.isfile(os.path.join(dst, stale)):
      os.remove(os.path.join(dst, stale))
  for name in names:
    paths.copy_file(f"{run.workdir}/{name}", os.path.join(dst, name))
  return names
