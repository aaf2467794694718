"""Mutation testing (mutmut 3) of the core maths and the verifier, one group of modules at a time.

  python experiments/mutation.py --groups=core,rewards --sample=200 --seed=0   # ~1 h, 2 busy cores
  python experiments/mutation.py --groups=core,rewards --max_children=8         # every mutant

Each group runs in its own copy of dapo_jax/ and tests/ under --workdir: the working tree is never
mutated and no mutmut config lives in the repository, so `python -m pytest -q tests` is untouched.
mutmut rewrites every function of the group's files into a trampoline that picks the original or
one mutant at call time; for each mutant it runs only the group's tests that call the mutated
function (from a first, instrumented run), in a process forked from a server that has imported
jax but run nothing, so jit caches start empty and a mutant cannot hide behind a function
compiled before it was switched on. A mutant is killed when a test fails, a timeout when it runs
past mutmut's limit (15x its tests' clean time + 1 s), and survives otherwise.

Prints, per file, the counts and the kill rate (killed + timeout) / checked, then every survivor
with its diff; exits 1 if a group's kill rate is below --min_kill_rate.
"""
import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# group -> (files to mutate, the fast tests that cover them). Test globs that match nothing are
# dropped, so a group still runs while a test file is being written.
GROUPS = {
    "core": (["dapo_jax/core/_checks.py", "dapo_jax/core/advantages.py",
              "dapo_jax/core/filtering.py", "dapo_jax/core/overlong.py", "dapo_jax/core/stats.py"],
             ["tests/test_core_advantages.py", "tests/test_core_filtering*.py",
              "tests/test_core_overlong*.py", "tests/test_core_stats.py",
              "tests/test_mutation_checks.py"]),
    "losses": (["dapo_jax/core/losses.py", "dapo_jax/core/loss_modes.py",
                "dapo_jax/core/offpolicy.py"],
               ["tests/test_core_losses*.py", "tests/test_mutation_losses.py"]),
    "rewards": (["dapo_jax/rewards/*.py"], ["tests/test_rewards*.py",
                                            "tests/test_mutation_rewards.py"]),
    # The trainer's host-side pieces; trainer.py / train_step.py are covered by the slow trainer
    # and train-step tests (minutes per mutant here), not by this group. The wiring tests run
    # only for the functions they call (score_rollout's Eq. 13 unit test among them).
    "train": (["dapo_jax/train/dynamic_sampling.py", "dapo_jax/train/groups.py",
               "dapo_jax/train/prefilter.py"],
              ["tests/test_train_dynamic_sampling.py", "tests/test_train_groups.py",
               "tests/test_train_prefilter.py", "tests/test_trainer_wiring.py"]),
}
# Imported by tests (tests/test_rewards_fuzz.py runs experiments/fuzz_verifier.py; configs).
ALSO_COPY = ("experiments", "configs")
# Imported once by the fork server: module loading is shared, no jax computation has run.
PRELOAD = ["numpy", "jax", "jax.numpy", "hypothesis", "pytest"]
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests", 34: "skipped",
          36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
          None: "not checked"}


def _expand(patterns):
  return sorted({os.path.relpath(p, ROOT) for pat in patterns
                 for p in glob.glob(os.path.join(ROOT, pat))})


def prepare(workdir, group):
  """A fresh copy of the package and tests under workdir/group with the group's mutmut config."""
  files, tests = (_expand(p) for p in GROUPS[group])
  if not files or not tests:
    raise SystemExit(f"mutation.py: group {group!r} has files {files} and tests {tests}")
  d = os.path.join(workdir, group)
  shutil.rmtree(d, ignore_errors=True)
  ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
  for sub in ("dapo_jax", "tests") + ALSO_COPY:
    shutil.copytree(os.path.join(ROOT, sub), os.path.join(d, sub), ignore=ignore)
  with open(os.path.join(d, "preload.txt"), "w") as f:
    f.write("\n".join(PRELOAD) + "\n")
  cfg = ["[mutmut]", "source_paths = dapo_jax", "only_mutate =", *("  " + p for p in files),
         "pytest_add_cli_args_test_selection =", *("  " + t for t in tests),
         "also_copy =", *("  " + a for a in ALSO_COPY),
         "process_isolation = forkserver", "forkserver_warmup = import",
         "preload_modules_file = preload.txt", "use_git_change_detection = false"]
  with open(os.path.join(d, "setup.cfg"), "w") as f:
    f.write("\n".join(cfg) + "\n")
  return d, files


def _mutmut(d, args, check=True):
  # The copies live outside the repo: point the data readers at the repo's shared data.
  shared = os.environ.get("DAPO_SHARED_DATA", os.path.join(os.path.dirname(ROOT), "shared", "data"))
  env = dict(os.environ, JAX_PLATFORMS="cpu", DAPO_SHARED_DATA=shared)
  return subprocess.run([sys.executable, "-m", "mutmut", *args], cwd=d, env=env, check=check,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout


def exit_codes(d, files):
  """{mutant name: (file, exit code or None)} from mutmut's per-file .meta records."""
  out = {}
  for f in files:
    meta = os.path.join(d, "mutants", f + ".meta")
    if os.path.exists(meta):
      with open(meta) as fh:
        out.update({k: (f, v) for k, v in json.load(fh)["exit_code_by_key"].items()})
  return out


def run_group(d, files, sample, seed, max_children):
  """Runs mutmut in d; with sample > 0, only a seeded random sample of the mutants."""
  names = []
  if sample:
    # Mutant names exist only once mutmut has generated them: a run filtered on a name that
    # matches nothing generates them (and the coverage stats), then stops.
    _mutmut(d, ["run", "--max-children", "1", "no-such-mutant"], check=False)
    every = sorted(exit_codes(d, files))
    if not every:
      raise SystemExit(f"mutation.py: no mutants generated in {d}")
    names = sorted(random.Random(seed).sample(every, min(sample, len(every))))
  log = _mutmut(d, ["run", "--max-children", str(max_children), *names], check=False)
  with open(os.path.join(d, "run.log"), "w") as f:
    f.write(log)
  codes = {k: v for k, v in exit_codes(d, files).items() if not names or k in names}
  if all(code is None for _, code in codes.values()):
    raise SystemExit(f"mutation.py: mutmut checked no mutant in {d}; its log ends:\n"
                     + log[-2000:].replace("\r", "\n"))
  return codes


def summarize(codes):
  """{file: {status: count}} plus the totals under "all"."""
  table = {}
  for f, code in codes.values():
    for key in (f, "all"):
      row = table.setdefault(key, {})
      status = STATUS.get(code, "suspicious")
      row[status] = row.get(status, 0) + 1
  return table


def kill_rate(row):
  checked = sum(v for k, v in row.items() if k not in ("not checked", "skipped"))
  return (row.get("killed", 0) + row.get("timeout", 0)) / max(checked, 1), checked


def report(group, d, codes):
  table = summarize(codes)
  print(f"## {group}  ({d})")
  print(f"{'module':44s} {'mutants':>7s} {'killed':>6s} {'surv':>5s} {'t/o':>4s} "
        f"{'notest':>6s} {'rate':>6s}")
  for module in sorted(table, key=lambda m: (m == "all", m)):
    row = table[module]
    rate, checked = kill_rate(row)
    print(f"{module:44s} {checked:7d} {row.get('killed', 0):6d} {row.get('survived', 0):5d} "
          f"{row.get('timeout', 0):4d} {row.get('no tests', 0):6d} {100 * rate:5.1f}%")
  for name in sorted(k for k, (_, v) in codes.items() if STATUS.get(v, "suspicious") not in
                     ("killed", "timeout", "not checked", "skipped")):
    diff = _mutmut(d, ["show", name], check=False).splitlines()
    changed = [ln for ln in diff if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    status = STATUS.get(codes[name][1], "suspicious")
    print(f"  {status}: {name}\n    " + "\n    ".join(changed))
  return kill_rate(table.get("all", {}))[0]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--groups", default="core,rewards", help=f"comma list of {sorted(GROUPS)}")
  p.add_argument("--workdir", default="/tmp/mutation", help="copies and mutmut state go here")
  p.add_argument("--sample", type=int, default=0, help="run a random sample of N mutants (0: all)")
  p.add_argument("--seed", type=int, default=0, help="seed of the sample")
  p.add_argument("--max_children", type=int, default=1, help="mutants run in parallel")
  p.add_argument("--min_kill_rate", type=float, default=0.9, help="exit 1 below this, any group")
  a = p.parse_args(argv)
  groups = a.groups.split(",")
  unknown = [g for g in groups if g not in GROUPS]
  if unknown:
    raise SystemExit(f"mutation.py: --groups: unknown {unknown}; expected some of {sorted(GROUPS)}")
  ok = True
  for group in groups:
    d, files = prepare(a.workdir, group)
    codes = run_group(d, files, a.sample, a.seed, a.max_children)
    ok &= report(group, d, codes) >= a.min_kill_rate
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
