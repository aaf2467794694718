"""A CPU rehearsal of the 32B pod run: its loop on 2 processes, a resume, and the TPU kernels.

COMMAND:
  python experiments/rehearse_pod.py --steps=3 --json=/tmp/rehearsal.json
EXPECTED: exit 0 when every check below holds, with loop_preemptions 72. On 2026-12-04 on a
  2-core Intel Xeon host, idle: 9 min 29 s (loop and resume 5 min 23 s, kernels 4 min 6 s;
  10 min 25 s and 10 min 41 s in two more runs). The form before preemption was exercised
  (64-token prompts, 16 decode steps a call) took 7 min 56 s there and 13 min 26 s on the
  2-core AMD EPYC host of 2026-12-03. --reuse keeps the stages a failed try finished.

Three stages, each in processes of its own:
1. loop: `python -m dapo_jax.main --config=configs/pod_rehearsal_cpu.py` on 2 processes x 4 CPU
   devices (jax.distributed over loopback, gloo), `--steps` rollout steps of the 32B config's
   code path (fsdp x tensor mesh, bf16 compute over float32 weights, a paged KV pool smaller than
   the batch needs, rows growing 4 tokens a call so that samples are preempted, packing, 16
   mini-batch updates a step, truncated IS, a checkpoint every step). Its attention is the
   CPU's (blocked training attention, the paged reference gather).
2. resume: the same workdir with its newest checkpoint removed, resumed on 2 processes: the
   resumed step's metrics must equal the uninterrupted run's (`resumed_identical`).
3. kernels: one process, 8 CPU devices of which the kernels' meshes take 4 (interpret mode can
   deadlock when every CPU device of a process runs a kernel: models/attention_shard.py; with 5,
   an all-reduce waited past XLA's 40 s rendezvous limit on the loaded machine and
   the process was ended). The same model sampled by the TPU paged-attention kernel (Pallas TPU
   interpret mode, sampler mesh data 2 x tensor 2, bf16, a pool smaller than the rows) and scored
   by the trainer with the TPU splash kernel (interpret mode, fsdp 2 x tensor 2, packed rows)
   against the reference path on the same tokens: float32, blocked attention, the paged reference
   gather, one device; and the float32 splash path again with context parallelism (mesh
   context 2 x tensor 2: each row's tokens over 2 devices, splash per shard against the
   gathered keys). Remat is off in this stage (the interpret mode's host callbacks cannot be
   rematerialised; remat recomputes the same maths).

The JSON: kernels_executed (the Pallas kernels stage 3 ran), processes and devices (stage 1),
steps, loss_rel_diff_max and logp_abs_diff_max (stage 3: bf16 pod path vs float32 reference,
the same tokens), context_parallel_logp_abs_diff_max (stage 3: float32 context-parallel splash
vs the float32 reference), resumed_identical (stage 2), loop_preemptions (stage 1: samples its KV pool
preempted, the steps' `sampler_preemptions` summed; the pool is sized to preempt, so 0 fails).

Tolerances (checked; exit 1 past them; experiments/rehearse_kernels.py:TOL), from bf16's 8
significant bits (1 ulp = 2^-7 of the leading power of two):
- kernels alone (float32 on both sides, splash vs blocked, same weights; also with context
  parallelism): |dlogp| <= 1e-4 nats.
  Sums in another order move a float32 log-prob of magnitude ~11 by ~1e-6; a segment-mask slip
  (a key of another sequence) moves it by O(0.1).
- bf16 pod path vs float32 reference: |dlogp| <= 0.25 nats = 4 bf16 ulps of a log-prob in
  [-16, -8] (a random policy over 49,152 tokens gives ~-10.8): each logit goes through 2
  layers of bf16-rounded activations, and a sign or masking slip moves log-probs by O(1). The
  loss within 5 % relative: it is a mean of advantage x IS weight, and the weights move with
  exp(dlogp) of the mean |dlogp| (a few bf16 ulps, ~1 %), not of the maximum.
- the paged kernel vs the reference gather (both bf16, same seed, a pool smaller than the rows): the
  same tokens, behaviour log-probs within the same 0.25 nats.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "experiments"))
sys.path.insert(0, REPO)
import launch_local  # noqa: E402  pylint: disable=wrong-import-position
from launch_runs import RunSpec  # noqa: E402  pylint: disable=wrong-import-position

CONFIG = "configs/pod_rehearsal_cpu.py"
PROCESSES, DEVICES_PER_PROCESS = 2, 4
VOLATILE = ("time_", "tokens_per_s", "wait_")


def _flags(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  p.add_argument("--steps", type=int, default=3, help="rollout steps of the loop (>= 2)")
  p.add_argument("--json", default=None, help="write the figures here")
  p.add_argument("--workdir", default="runs/pod_rehearsal", help="scratch directory")
  p.add_argument("--prompts", type=int, default=2, help="stage 3: prompts (x G = 4)")
  p.add_argument("--reuse", action="store_true",
                 help="keep the stages already finished in --workdir (their results files)")
  p.add_argument("--stage", default="all", choices=["all", "kernels"], help=argparse.SUPPRESS)
  p.add_argument("--out", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.steps < 2:
    p.error(f"--steps: must be >= 2 (a resume needs an earlier checkpoint), got {args.steps}")
  if args.prompts < 1:
    p.error(f"--prompts: must be >= 1, got {args.prompts}")
  return args


def tokenizer_dir(workdir: str) -> str:
  """SmolLM2's tokenizer (ChatML template) written from the shipped GGUF, once."""
  out = os.path.join(workdir, "tokenizer")
  if not os.path.isfile(os.path.join(out, "tokenizer_config.json")):
    from pathlib import Path  # pylint: disable=import-outside-toplevel
    from dapo_jax.models import gguf_import  # pylint: disable=import-outside-toplevel
    reader = gguf_import.open_gguf(gguf_import.find_smollm2_gguf())
    Path(out).mkdir(parents=True, exist_ok=True)
    gguf_import.save_tokenizer(gguf_import.build_tokenizer(reader), Path(out))
  return os.path.abspath(out)


def _run_processes(spec: RunSpec, log: str, timeout: int = 1800):
  cmds = launch_local.multihost_commands(spec, PROCESSES, DEVICES_PER_PROCESS)
  with open(log, "a", encoding="utf-8") as f:
    procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT)
             for argv, env in cmds]
    codes = [p.wait(timeout=timeout) for p in procs]
  if any(codes):
    raise RuntimeError(f"{spec.workdir}: exit codes {codes}; the log is {log}")


def _records(workdir: str) -> list[dict]:
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in f]


def _done(workdir: str, reuse: bool) -> bool:
  return reuse and os.path.isfile(os.path.join(workdir, "results.json"))


def loop_and_resume(workdir: str, steps: int, tok: str, reuse: bool) -> dict:
  """Stages 1 and 2: the loop on 2 processes, then a resume from its second-newest checkpoint."""
  arg = f"{CONFIG}:tokenizer={tok}"
  full = os.path.join(workdir, "loop")
  if not _done(full, reuse):
    shutil.rmtree(full, ignore_errors=True)
    _run_processes(RunSpec("loop", arg, {"train.num_steps": steps}, full), full + ".log")
  resumed = os.path.join(workdir, "resumed")
  if not _done(resumed, reuse):
    shutil.rmtree(resumed, ignore_errors=True)
    shutil.copytree(full, resumed, ignore=shutil.ignore_patterns("run.lock"))
    ckpt = os.path.join(resumed, "checkpoints")
    newest = max(int(d) for d in os.listdir(ckpt) if d.isdigit())
    shutil.rmtree(os.path.join(ckpt, str(newest)))
    os.remove(os.path.join(resumed, "results.json"))
    _run_processes(RunSpec("resumed", arg, {"train.num_steps": steps}, resumed),
                   resumed + ".log")
  a, b = _records(full), _records(resumed)
  last = lambda recs: [r for r in recs if r.get("step") == steps]
  return {"resumed_identical": bool(last(a)) and last(a) == last(b),
          "records": len(a), "resumed_step_records": last(b),
          "preemptions": int(sum(r.get("sampler_preemptions", 0) for r in a
                                 if r.get("kind") == "train"))}


def kernels(workdir: str, prompts: int, reuse: bool) -> dict:
  """Stage 3 in a process of its own (8 forced CPU devices, set before JAX starts)."""
  out = os.path.join(workdir, "kernels.json")
  if reuse and os.path.isfile(out):
    with open(out, encoding="utf-8") as f:
      return json.load(f)
  env = dict(os.environ, JAX_PLATFORMS="cpu",
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  p = subprocess.run([sys.executable, os.path.abspath(__file__), "--stage=kernels",
                      f"--workdir={workdir}", f"--prompts={prompts}", f"--out={out}"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
  if p.returncode:
    raise RuntimeError(f"kernel stage failed:\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}")
  with open(out, encoding="utf-8") as f:
    return json.load(f)


def main(argv=None) -> int:
  args = _flags(argv)
  os.makedirs(args.workdir, exist_ok=True)
  tok = tokenizer_dir(args.workdir)
  if args.stage == "kernels":
    import rehearse_kernels  # pylint: disable=import-outside-toplevel
    result = rehearse_kernels.run(rehearse_kernels.rehearsal_config(tok), args.prompts)
    with open(args.out, "w", encoding="utf-8") as f:  # written only once the stage succeeded
      json.dump(result, f, indent=2)
    return 0
  t0 = time.time()
  loop = loop_and_resume(args.workdir, args.steps, tok, args.reuse)
  print(f"[rehearse] loop + resume: {time.time() - t0:.0f} s", flush=True)
  k = kernels(args.workdir, args.prompts, args.reuse)
  print(f"[rehearse] kernels: {time.time() - t0:.0f} s in all; {json.dumps(k['detail'])}")
  out = {"kernels_executed": k["kernels_executed"], "processes": PROCESSES,
         "devices": PROCESSES * DEVICES_PER_PROCESS, "steps": args.steps,
         "loss_rel_diff_max": k["loss_rel_diff_max"],
         "logp_abs_diff_max": k["logp_abs_diff_max"],
         "context_parallel_logp_abs_diff_max": k["context_parallel_logp_abs_diff_max"],
         "resumed_identical": loop["resumed_identical"],
         "loop_preemptions": loop["preemptions"]}
  print(json.dumps(out, indent=2))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(out, f, indent=2)
  fails = k["failures"] + ([] if loop["resumed_identical"] else [
      f"resumed step differs from the uninterrupted run: {loop['resumed_step_records']}"]) + (
      [] if loop["preemptions"] else ["the loop's KV pool preempted no sample (it is sized to)"])
  for line in fails:
    print(f"FAIL: {line}", file=sys.stderr)
  return 1 if fails else 0


if __name__ == "__main__":
  sys.exit(main())
