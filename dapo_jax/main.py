"""Runs one dapo_jax job: warm start (if configured), DAPO training, before/after evaluation.

  python -m dapo_jax.main --config=configs/tiny_cpu.py --workdir=runs/tiny
  python -m dapo_jax.main --config=configs/ladder.py:rung=naive_grpo --workdir=runs/naive
  python -m dapo_jax.main --config=configs/tiny_cpu.py --config.algo.eps_high=0.4 --workdir=...
  ... --resume   # continue from the workdir's newest intact checkpoint

SIGTERM (a preemption notice) saves a checkpoint at the end of the current step and exits 0;
`--resume` continues from it. Resuming a run that finished does nothing. A failed checkpoint
save or a lost peer process ends the run with exit status 1 and the cause as the last line.
"""
import json
import os

from absl import app, flags
from ml_collections import config_flags

flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and the exported policy.")
flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")
config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


def _fmt(e: dict, key: str) -> str:
  return f"{100 * e[key]:.1f}% [95% CI {100 * e[key + '_ci_lo']:.1f}, {100 * e[key + '_ci_hi']:.1f}]"


def _finished(workdir: str, num_steps: int) -> dict | None:
  """The results of a run in `workdir` that already did `num_steps` steps, else None."""
  path = os.path.join(workdir, "results.json")
  if not os.path.exists(path):
    return None
  with open(path, encoding="utf-8") as f:
    results = json.load(f)
  return results if results["steps"] >= num_steps else None


def _write_json(path: str, obj) -> None:
  """Atomic: a kill leaves the old file or the new one, never half of one."""
  with open(path + ".tmp", "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2)
  os.replace(path + ".tmp", path)


def main(argv):
  del argv
  # Imports after flag parsing: config errors surface before JAX starts.
  from dapo_jax import config as config_lib, distributed  # pylint: disable=import-outside-toplevel
  cfg = config_lib.parse(FLAGS.config)
  workdir = os.path.abspath(FLAGS.workdir)
  done = _finished(workdir, cfg.train.num_steps) if FLAGS.resume else None
  if done is not None:
    print(f"[resume] {workdir} already finished its {done['steps']} steps (results.json): "
          f"nothing to do", flush=True)
    return
  distributed.initialize(cfg.distributed)
  try:
    _run(cfg, workdir)
  except Exception as e:  # pylint: disable=broad-except
    distributed.exit_on_fault(e)  # returns for an ordinary error (re-raised below)
    raise


def _run(cfg, workdir: str):
  import jax  # pylint: disable=import-outside-toplevel
  from dapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  from dapo_jax.train import trainer  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
      f.write(FLAGS.config.to_json_best_effort(indent=2))
  run = trainer.build(cfg, workdir, resume=FLAGS.resume)
  results = trainer.train(run, resume=FLAGS.resume)
  if results.get("preempted"):
    print(f"[preempt] saved step {results['steps']} in {workdir}/checkpoints; exiting. Continue "
          f"with --resume", flush=True)
    return
  if cfg.checkpoint.export_hf:
    # Every process takes part (the params are gathered across hosts); process 0 writes.
    out = os.path.join(workdir, "export")
    hf_io.save_pretrained(nnx.merge(run.graphdef, run.state.params), run.model_config, out,
                          overwrite=True)
    if jax.process_index() == 0:
      run.task.tokenizer.save_pretrained(out)
      print(f"[export] HF checkpoint: {out}")
  if jax.process_index() == 0:
    _write_json(os.path.join(workdir, "results.json"), results)
    _report(results, cfg.eval.num_samples, workdir)


def _report(results: dict, k: int, workdir: str):
  if "before" in results:
    print(f"[eval] before: avg@{k} {_fmt(results['before'], f'avg@{k}')}")
  print(f"[eval] after:  avg@{k} {_fmt(results['after'], f'avg@{k}')}")
  print(f"[logs] {workdir}/metrics.jsonl, tensorboard in {workdir}/tensorboard")


if __name__ == "__main__":
  app.run(main)
