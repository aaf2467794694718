"""The commands a launch runs on Cloud TPU: the slice (a queued resource), the workers' set-up,
a run on every worker, the GKE/xpk workload, and the ahead-of-time fit check.

Each function returns the argv of one command; experiments/launch.py prints them (--dry_run) or
runs them. No cloud access is needed to build them, so tests check them field by field.
"""
import dataclasses
import os
import re
import shlex
import subprocess
import sys

import launch_detached
from launch_runs import REPO, LaunchError, RunSpec

# Default TPU VM software per TPU generation (gcloud's --runtime-version).
RUNTIME_VERSIONS = {"v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite",
                    "v5p": "v2-alpha-tpuv5", "v6e": "v2-alpha-tpuv6e"}
# gcloud's accelerator type prefix -> the fit check's slice name (dapo_jax.aot.topology).
_TOPOLOGY_NAMES = {"v5litepod": "v5e"}
ACTIVE, FAILED_STATES = "ACTIVE", ("FAILED", "SUSPENDING", "SUSPENDED")


@dataclasses.dataclass(frozen=True)
class Pod:
  """Where a TPU VM pod's runs go (gcloud's names)."""
  tpu_name: str
  zone: str
  project: str = ""
  repo_dir: str = "~/dapo_jax"  # on each worker, used unquoted so that ~ expands

  @property
  def venv(self) -> str:
    """The workers' Python >= 3.11 environment (beside the tree, which a new commit replaces)."""
    return f"{self.repo_dir}-venv"

  @property
  def python(self) -> str:
    return f"{self.venv}/bin/python"

  @property
  def log_dir(self) -> str:
    """Each worker's own run logs (<run>.<worker host>.log), on its local disk."""
    return f"{self.repo_dir}-logs"

  def gcloud(self, verb: str, *positional: str, flags=()) -> list[str]:
    """`gcloud compute tpus <verb> <positional> --zone=Z [--project=P] <flags>`."""
    cmd = ["gcloud", "compute", "tpus", *verb.split(), *positional, f"--zone={self.zone}"]
    return cmd + ([f"--project={self.project}"] if self.project else []) + list(flags)


def topology_of(accelerator_type: str) -> str:
  """The fit check's slice name for a gcloud accelerator type (v5litepod-16 -> v5e-16)."""
  gen, _, size = accelerator_type.partition("-")
  if gen not in RUNTIME_VERSIONS or not size.isdigit():
    raise LaunchError(f"--accelerator_type={accelerator_type}: expected <generation>-<cores> "
                      f"with a generation of {sorted(RUNTIME_VERSIONS)}, e.g. v5p-128")
  return f"{_TOPOLOGY_NAMES.get(gen, gen)}-{size}"


def runtime_version(accelerator_type: str, given: str = "") -> str:
  return given or RUNTIME_VERSIONS[accelerator_type.partition("-")[0]]


# ----- the slice: a queued resource ------------------------------------------------------------
def queued_resource_create(pod: Pod, *, accelerator_type: str, runtime: str,
                           capacity: str) -> list[str]:
  """Asks for the slice; the queued resource and the TPU VM share the pod's name."""
  cmd = pod.gcloud("queued-resources create", pod.tpu_name, flags=(
      f"--node-id={pod.tpu_name}", f"--accelerator-type={accelerator_type}",
      f"--runtime-version={runtime}"))
  return cmd + {"on-demand": [], "spot": ["--spot"], "reserved": ["--reserved"]}[capacity]


def queued_resource_delete(pod: Pod) -> list[str]:
  """Removes a request that failed or whose slice was preempted (its TPU VM too), so that the
  same name can be asked for again."""
  return pod.gcloud("queued-resources delete", pod.tpu_name, flags=("--force", "--quiet"))


def queued_resource_state(pod: Pod) -> list[str]:
  """Prints the request's state (WAITING_FOR_RESOURCES, PROVISIONING, ACTIVE, FAILED, ...)."""
  return pod.gcloud("queued-resources describe", pod.tpu_name,
                    flags=("--format=value(state.state)",))


# ----- the workers: the launching commit's tree and the TPU requirements -----------------------
def repo_commit() -> tuple[str, bool]:
  """(HEAD's sha, whether the working tree has changes a commit does not hold)."""
  sha = subprocess.run(["git", "-C", REPO, "rev-parse", "HEAD"], capture_output=True,
                       text=True, check=True).stdout.strip()
  dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                         capture_output=True, text=True, check=True).stdout.strip()
  return sha, bool(dirty)


MIN_PYTHON = (3, 11)  # jax, jaxlib and libtpu 0.10.2 need it; TPU VM images ship 3.10


def _python_ok(python: str) -> str:
  return f"{python} -c 'import sys; sys.exit(sys.version_info < {MIN_PYTHON})' 2>/dev/null"


def setup_commands(pod: Pod, sha: str) -> list[list[str]]:
  """Idempotent: the commit's tree replaces <repo_dir> on every worker only when its .commit
  differs; <repo_dir>-venv is made once with a Python >= 3.11 (the image's python3 where it is
  one, else uv's own CPython 3.11: the TPU VM images' python3 is 3.10), checked on every worker
  (an `error:` line naming the worker if there is none), and requirements-tpu.txt installed
  into it (a no-op once satisfied)."""
  archive = f"/tmp/dapo_jax-{sha[:12]}.tar.gz"
  d, venv, want = pod.repo_dir, pod.venv, ".".join(map(str, MIN_PYTHON))
  script = (f"set -e; if [ \"$(cat {d}/.commit 2>/dev/null)\" != {sha} ]; then "
            f"rm -rf {d}.new && mkdir -p {d}.new && tar -xzf {archive} -C {d}.new && "
            f"echo {sha} > {d}.new/.commit && rm -rf {d} && mv {d}.new {d}; fi; "
            f"if ! {_python_ok(pod.python)}; then rm -rf {venv}; "
            f"if {_python_ok('python3')}; then python3 -m venv {venv} || true; else "
            f"python3 -m pip install --user --quiet uv && "
            f"python3 -m uv venv --quiet --seed --python {want} {venv} || true; fi; fi; "
            f"if ! {_python_ok(pod.python)}; then echo \"error: no Python >= {want} on worker "
            f"$(hostname) (python3 is $(python3 -V 2>&1)) and uv could not fetch one: use a TPU "
            f"VM image with Python >= {want} (--runtime_version)\" >&2; exit 1; fi; "
            f"{pod.python} -m pip install --quiet -r {d}/requirements-tpu.txt")
  return [["git", "-C", REPO, "archive", "--format=tar.gz", f"--output={archive}", sha],
          pod.gcloud("tpu-vm scp", archive, f"{pod.tpu_name}:{archive}", flags=("--worker=all",)),
          pod.gcloud("tpu-vm ssh", pod.tpu_name, flags=("--worker=all", f"--command={script}"))]


# ----- a run ---------------------------------------------------------------------------------
def tpu_pod_command(run: RunSpec, pod: Pod, *, launch_id: str) -> list[str]:
  """The gcloud command that starts this run's main on every worker of the pod, detached
  (launch_detached.detached_script), with the set-up's Python, and returns at once."""
  script = launch_detached.detached_script(run, repo_dir=pod.repo_dir, python=pod.python,
                                           log_dir=pod.log_dir, launch_id=launch_id)
  return pod.gcloud("tpu-vm ssh", pod.tpu_name, flags=("--worker=all", f"--command={script}"))


def workload_name(run: RunSpec) -> str:
  """xpk's workload name for a run: its config file's name and the run's, as
  [a-z]([-a-z0-9]*[a-z0-9])?, at most 40 characters (a sweep-less config's one run is not just
  `run`: configs/dapo_qwen25_32b.py gives dapo-qwen25-32b-run)."""
  stem = os.path.splitext(os.path.basename(run.config_arg.partition(":")[0]))[0]
  name = re.sub(r"[^a-z0-9-]+", "-", f"{stem}-{run.name}".lower()).strip("-")
  name = ("r-" + name if not name[:1].isalpha() else name)[:40].rstrip("-")
  return name


def xpk_command(run: RunSpec, *, cluster: str, accelerator_type: str, image: str, zone: str,
                project: str, max_restarts: int, grace_s: int) -> list[str]:
  """`xpk workload create` for a run (GKE): xpk adds the repo (the script dir) to `image`; the
  command installs requirements-tpu.txt there (a no-op when the image has them) and runs main
  with --resume, so a restart after a preemption (JobSet, --max-restarts) continues from the
  newest checkpoint (a first start finds none and starts at step 0). A stop signal makes main
  finish its step, save and exit 75: --restart-on-user-code-failure lets that exit restart the
  JobSet (xpk restarts only system failures otherwise), and --termination-grace-period-seconds
  (`grace_s`) must cover the rest of a step plus a save before GKE kills the pod."""
  inner = run.argv(python="python3")
  inner = ["python3", "-m", "pip", "install", "--quiet", "-r", "requirements-tpu.txt", "&&",
           *inner, *([] if "--resume" in inner else ["--resume"])]
  cmd = ["xpk", "workload", "create", f"--cluster={cluster}",
         f"--workload={workload_name(run)}", f"--tpu-type={accelerator_type}",
         "--num-slices=1", f"--base-docker-image={image}", f"--script-dir={REPO}",
         f"--max-restarts={max_restarts}", "--restart-on-user-code-failure",
         f"--termination-grace-period-seconds={grace_s}",
         f"--command={' '.join(a if a == '&&' else shlex.quote(a) for a in inner)}"]
  return cmd + ([f"--zone={zone}"] if zone else []) + (
      [f"--project={project}"] if project else [])


# ----- the fit check ---------------------------------------------------------------------------
# Overrides that change no compiled shape or buffer: runs differing only in these share one
# ahead-of-time check (an eps_high sweep compiles once; a max_new_tokens sweep does not).
_AOT_NEUTRAL = ("seed", "algo.eps_low", "algo.eps_high", "algo.clip_c", "algo.overlong_cache_len",
                "algo.overlong_factor", "algo.overlong_penalty", "algo.overlong_filter",
                "rollout.temperature", "rollout.top_p", "rollout.top_k", "train.num_steps",
                "optim.", "eval.", "checkpoint.", "log.", "distributed.")


def aot_key(run: RunSpec) -> tuple:
  kept = {k: v for k, v in run.overrides.items() if not k.startswith(_AOT_NEUTRAL)}
  return (run.config_arg, tuple(sorted((k, str(v)) for k, v in kept.items())))


def _compile(config_arg: str, kept: tuple, topology: str, *, label: str = ""):
  cmd = [sys.executable, "-m", "dapo_jax.aot", f"--config={config_arg}",
         f"--topology={topology}"] + [f"--config.{k}={v}" for k, v in kept]
  if label:
    print(f"[aot] {label}: {' '.join(map(shlex.quote, cmd))}", flush=True)
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=False)


def larger_slices(topology: str) -> list[str]:
  """The slices of `topology`'s generation with more chips, smallest first."""
  from dapo_jax.aot import topology as topo  # pylint: disable=import-outside-toplevel  (no JAX)
  sl = topo.parse(topology)
  return [f"{sl.gen.prefix}-{c * sl.gen.cores_per_chip}" for c in sorted(sl.gen.grids)
          if c > sl.chips]


def aot_check(runs: list, topology: str, *, search: bool = False) -> dict:
  """Compiles each distinct run for the slice (python -m dapo_jax.aot); returns {name: the
  smallest larger slice of the generation it fits by compilation (`search`), or None} for the
  runs that do not fit (or whose check failed)."""
  groups: dict = {}
  for run in runs:
    groups.setdefault(aot_key(run), []).append(run)
  misfits = {}
  for (config_arg, kept), members in groups.items():
    p = _compile(config_arg, kept, topology, label=", ".join(r.name for r in members))
    print("\n".join(l for l in p.stdout.splitlines() if not l.startswith("[aot] ")))
    if p.returncode not in (0, 1):  # failed before a verdict (a bad config, no libtpu)
      print((p.stderr.strip().splitlines() or ["the check failed"])[-1])
    if p.returncode == 0:
      continue
    fits = next((s for s in (larger_slices(topology) if search and p.returncode == 1 else ())
                 if _fits(config_arg, kept, s)), None)
    misfits.update({r.name: fits for r in members})
  return misfits


def _fits(config_arg: str, kept: tuple, topology: str) -> bool:
  p = _compile(config_arg, kept, topology)
  print(f"[aot] {topology}: " + ("fits" if p.returncode == 0 else "does not fit" if
                                 p.returncode == 1 else "check failed"), flush=True)
  return p.returncode == 0


def fit_check(args, runs: list) -> None:
  """The fit check of every distinct run still to do (tpu-pod, xpk), unless skipped; a refusal
  names, with --fit_search, the smallest larger slice each misfit fits by compilation."""
  if args.backend not in ("tpu-pod", "xpk") or args.skip_fit_check:
    return
  pending = [r for r in runs if r.status() != "finished"]
  misfits = aot_check(pending, args.topology, search=args.fit_search) if pending else {}
  if not misfits:
    return
  found = [f"{n} fits {s}" if s else f"{n} fits no larger slice" for n, s in misfits.items()]
  hint = ("; by compilation: " + ", ".join(found) if args.fit_search else
          "; --fit_search compiles them for the larger slices of this generation and names the "
          "smallest that fits")
  raise LaunchError(f"--topology={args.topology}: {', '.join(misfits)} do(es) not fit the "
                    f"slice (see the tables above){hint}; --skip_fit_check launches anyway")
