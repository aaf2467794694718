"""Kill a small training run at seeded random points, resume it each time, compare with a clean run.

  python experiments/chaos.py --kills=5 --seed=0        # ~10 min on 2 CPU cores
  EXPECTED last line: 5/5 resumed runs identical

Runs configs/tiny_cpu.py:runlocal=True with tiny settings (CHAOS_SETTINGS: a checkpoint every
step, asynchronous saves, at least two dynamic-sampling rounds per step) as a subprocess: once
uninterrupted, then once more killed at K points drawn from --seed, each time resumed with
--resume from the same workdir. The kinds of kill point (each a real signal to the process):
  round  SIGKILL at the start of generation round r >= 1 of step s (between dynamic-sampling rounds)
  save   SIGKILL while step s's asynchronous checkpoint save is being written
  seam   SIGKILL after step s's metrics line, before its checkpoint save starts
  term   SIGTERM during step s (a preemption notice: must save step s and exit 75)
At the end the killed-and-resumed run must equal the clean one: parameters and optimizer state
bitwise, the data-iterator position and the rest of the checkpoint metadata, metrics.jsonl (one
record per step and evaluation, equal values except timings) and results.json. A table of kill
points and verdicts is printed; the last line is "K/K resumed runs identical" when all hold.

The hooks run inside the child (this file with --child=KIND:STEP:ROUND) around the trainer's own
functions, so no test code lives in the package.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
from dapo_jax.workdir.run_state import PREEMPTED_EXIT  # noqa: E402  (no JAX: the parent stays light)
CONFIG = "configs/tiny_cpu.py:runlocal=True"
CHAOS_SETTINGS = {
    "train.batch_size": 4, "train.num_minibatches": 2, "algo.gen_batch_size": 3,
    "rollout.group_size": 8, "rollout.num_slots": 32, "eval.num_problems": 4,
    "eval.num_samples": 2, "eval.bootstrap_samples": 10, "checkpoint.every_steps": 1,
    "checkpoint.keep": 2, "checkpoint.async_save": True, "checkpoint.export_hf": False,
    "log.progress": False,
}
KINDS = ("round", "save", "seam", "term")
VOLATILE = ("time_", "tokens_per_s")


# ----- the child: the trainer with one kill hook --------------------------------------------

def _die(note: str):
  print(f"[chaos] {note}: SIGKILL", flush=True)
  os.kill(os.getpid(), signal.SIGKILL)


def _install(kind: str, step: int, rnd: int):
  """Wraps a trainer function so the process is signalled at (kind, step, round)."""
  from dapo_jax.train import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from dapo_jax.train import rounds, trainer  # pylint: disable=import-outside-toplevel
  if kind == "round":
    gen = rounds.generate_round

    def round_hook(run, round_index, num_prompts, **kwargs):
      if run.loop.step + 1 == step and round_index == rnd:
        _die(f"step {step}, before generation round {rnd}")
      return gen(run, round_index, num_prompts, **kwargs)
    rounds.generate_round = round_hook
  elif kind in ("save", "seam"):
    save = ckpt_lib.Checkpointer.save

    def save_hook(self, s, state, meta):
      if s == step and kind == "seam":
        _die(f"step {step}'s metrics line written, its checkpoint not started")
      save(self, s, state, meta)
      if s == step:
        tmp = [d for d in os.listdir(self.directory) if ckpt_lib.TMP_MARK in d]
        _die(f"step {step}'s save in flight (temporary directory {tmp or 'gone: committed'})")
    ckpt_lib.Checkpointer.save = save_hook
  else:
    rollout_step = trainer.rollout_step

    def term_hook(run, *args, **kwargs):
      if run.loop.step + 1 == step:
        os.kill(os.getpid(), signal.SIGTERM)
      return rollout_step(run, *args, **kwargs)
    trainer.rollout_step = term_hook


def child(spec: str, argv: list[str]):
  sys.path.insert(0, REPO)
  from absl import app  # pylint: disable=import-outside-toplevel
  from dapo_jax import main as main_lib  # pylint: disable=import-outside-toplevel
  if spec != "none":
    kind, step, rnd = spec.split(":")
    _install(kind, int(step), int(rnd))
  app.run(main_lib.main, argv=[sys.argv[0]] + argv)


# ----- the parent: runs, kill points, comparison --------------------------------------------

def _segment(workdir: str, steps: int, spec: str, resume: bool, log: str) -> tuple[int, str]:
  """Runs the child once; (return code, its output)."""
  argv = [sys.executable, os.path.abspath(__file__), f"--child={spec}", "--",
          f"--config={CONFIG}", f"--workdir={workdir}", f"--config.train.num_steps={steps}"]
  argv += [f"--config.{k}={v}" for k, v in CHAOS_SETTINGS.items()]
  argv += ["--resume"] if resume else []
  # One persistent compilation cache for all runs: each restart skips most of its compiles
  # (an executable loaded from the cache computes what the freshly compiled one does).
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             JAX_COMPILATION_CACHE_DIR=os.path.join(os.path.dirname(workdir), "jax_cache"),
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             XLA_FLAGS="--xla_force_host_platform_device_count=1")  # not the caller's (tests: 8)
  with open(log, "w", encoding="utf-8") as f:
    rc = subprocess.run(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                        timeout=900, check=False).returncode
  with open(log, encoding="utf-8") as f:
    return rc, f.read()


def _records(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in f]


def draw(kills: int, seed: int, steps: int, rounds: dict[int, int]) -> list[tuple]:
  """K kill points (kind, step, round), in run order, on distinct steps 1..steps-1.

  Kinds cycle from a seeded start so any K >= 2 has both a kill between dynamic-sampling rounds
  and one inside a save; the round of a "round" kill is one the clean run actually reached."""
  rng = np.random.default_rng(seed)
  if kills > steps - 1:
    raise ValueError(f"--kills={kills} needs --steps >= {kills + 1}")
  chosen = sorted(rng.choice(np.arange(1, steps), size=kills, replace=False).tolist())
  first = int(rng.integers(len(KINDS)))
  points = []
  for i, s in enumerate(chosen):
    kind = KINDS[(first + i) % len(KINDS)]
    rnd = int(rng.integers(1, rounds[s])) if kind == "round" else 0
    points.append((kind, s, rnd))
  return points


def _load_step(ckpt_dir: str):
  """(step, state arrays by path, metadata) of the newest checkpoint in ckpt_dir."""
  import jax  # pylint: disable=import-outside-toplevel
  import orbax.checkpoint as ocp  # pylint: disable=import-outside-toplevel
  step = max(int(d) for d in os.listdir(ckpt_dir) if d.isdigit())
  state = ocp.PyTreeCheckpointer().restore(os.path.join(ckpt_dir, str(step), "state"))
  leaves = {jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_leaves_with_path(state)}
  with open(os.path.join(ckpt_dir, str(step), "meta", "metadata"), encoding="utf-8") as f:
    return step, leaves, json.load(f)


def compare(ref: str, got: str) -> list[str]:
  """How the resumed run `got` differs from the clean run `ref` ([] when identical)."""
  diffs = []
  recs = _records(got)
  keys = [(r["step"], r["kind"], r.get("tag")) for r in recs]
  if len(set(keys)) != len(keys):
    diffs.append(f"metrics.jsonl has duplicate records: {keys}")
  if recs != _records(ref):
    diffs.append("metrics.jsonl differs from the clean run's")
  for name in ("results.json",):
    with open(os.path.join(ref, name), encoding="utf-8") as a, \
         open(os.path.join(got, name), encoding="utf-8") as b:
      if json.load(a) != json.load(b):
        diffs.append(f"{name} differs")
  s1, state1, meta1 = _load_step(os.path.join(ref, "checkpoints"))
  s2, state2, meta2 = _load_step(os.path.join(got, "checkpoints"))
  if s1 != s2 or state1.keys() != state2.keys():
    return diffs + [f"final checkpoints differ in step ({s1} vs {s2}) or structure"]
  diffs += [f"checkpoint array {k} differs" for k in state1
            if not np.array_equal(state1[k], state2[k])]
  diffs += [f"checkpoint metadata {k!r} differs ({meta1[k]} vs {meta2.get(k)})"
            for k in meta1 if meta1[k] != meta2.get(k)]
  return diffs


def _row(i: int, point: tuple, rc: int, out: str, next_out: str) -> dict:
  """One kill: did it land as planned, and what did the resume that followed report?"""
  kind, step, rnd = point
  if kind == "term":
    landed = rc == PREEMPTED_EXIT and f"[preempt] saved step {step} " in out
  else:
    landed = rc == -signal.SIGKILL and "[chaos]" in out
  # A kill inside the first save leaves no checkpoint: the resume starts over at step 0.
  resumed = re.search(r"\[resume\] (?:from|no checkpoint in \S+: starting at) step (\d+)",
                      next_out)
  dropped = re.search(r"dropped (\d+) written after", next_out)
  rejected = re.findall(r"\[checkpoint\] step (\d+) .* unusable: ([^\n]*)", next_out)
  where = f"step {step}" + (f" round {rnd}" if kind == "round" else "")
  return {"#": i, "kill": f"{kind} @ {where}", "rc": rc, "landed": landed,
          "resumed": int(resumed.group(1)) if resumed else None,
          "dropped": int(dropped.group(1)) if dropped else 0,
          "rejected": "; ".join(f"{s}: {why[:40]}" for s, why in rejected) or "-"}


def _table(rows: list[dict], identical: bool) -> list[str]:
  lines = [f"{'#':>2}  {'kill point':<22} {'rc':>4}  {'landed':<6}  {'resumed from':<12}  "
           f"{'dropped':>7}  {'rejected checkpoints':<46}  verdict"]
  for r in rows:
    ok = r["landed"] and r["resumed"] is not None and identical
    r["ok"] = ok
    lines.append(f"{r['#']:>2}  {r['kill']:<22} {r['rc']:>4}  {str(r['landed']):<6}  "
                 f"{'step ' + str(r['resumed']) if r['resumed'] is not None else '-':<12}  "
                 f"{r['dropped']:>7}  {r['rejected']:<46}  "
                 f"{'identical' if ok else 'FAILED'}")
  return lines


def run(kills: int, seed: int, steps: int, root: str) -> int:
  ref, got = os.path.join(root, "clean"), os.path.join(root, "killed")
  rc, out = _segment(ref, steps, "none", False, os.path.join(root, "clean.log"))
  if rc != 0:
    raise RuntimeError(f"the clean run failed (rc {rc}):\n{out[-3000:]}")
  rounds = {r["step"]: int(r["gen_rounds"]) for r in _records(ref) if r["kind"] == "train"}
  points = draw(kills, seed, steps, rounds)
  print(f"[chaos] clean run done; kill points (seed {seed}): {points}", flush=True)
  outs = []
  for i, point in enumerate(points + [None]):
    spec = "none" if point is None else ":".join(map(str, point))
    outs.append(_segment(got, steps, spec, i > 0, os.path.join(root, f"segment{i}.log")))
    print(f"[chaos] segment {i} ({spec}): rc {outs[-1][0]}", flush=True)
  if outs[-1][0] != 0:
    raise RuntimeError(f"the last resume failed (rc {outs[-1][0]}):\n{outs[-1][1][-3000:]}")
  diffs = compare(ref, got)
  rows = [_row(i + 1, p, outs[i][0], outs[i][1], outs[i + 1][1]) for i, p in enumerate(points)]
  print("\n".join(_table(rows, not diffs)))
  for d in diffs:
    print(f"  difference: {d}")
  ok = sum(r["ok"] for r in rows)
  print(f"{ok}/{kills} resumed runs identical", flush=True)
  return 0 if ok == kills else 1


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--kills", type=int, default=5, help="kill points (K)")
  ap.add_argument("--seed", type=int, default=0, help="draws the kill points")
  ap.add_argument("--steps", type=int, default=0, help="rollout steps; 0 = kills + 2")
  ap.add_argument("--workdir", default="", help="where the two runs go (default: a temp dir)")
  args = ap.parse_args(argv)
  if args.kills < 1:
    ap.error("--kills must be >= 1")
  steps = args.steps or args.kills + 2
  root = args.workdir or tempfile.mkdtemp(prefix="dapo_chaos_")
  os.makedirs(root, exist_ok=True)
  print(f"[chaos] {args.kills} kills, seed {args.seed}, {steps} steps, in {root}", flush=True)
  return run(args.kills, args.seed, steps, root)


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1].startswith("--child="):
    child(sys.argv[1].split("=", 1)[1], sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:])
  else:
    sys.exit(main())
