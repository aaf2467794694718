"""Runs one dapo_jax job: warm start (if configured), DAPO training, before/after evaluation.

  python -m dapo_jax.main --config=configs/tiny_cpu.py --workdir=runs/tiny
  python -m dapo_jax.main --config=configs/ladder.py:rung=naive_grpo --workdir=runs/naive
  python -m dapo_jax.main --config=configs/tiny_cpu.py --config.algo.eps_high=0.4 --workdir=...
  ... --resume   # continue from the workdir's latest checkpoint
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


def main(argv):
  del argv
  # Imports after flag parsing: config errors surface before JAX starts.
  from dapo_jax import config as config_lib, distributed  # pylint: disable=import-outside-toplevel
  cfg = config_lib.parse(FLAGS.config)
  distributed.initialize(cfg.distributed)
  import jax  # pylint: disable=import-outside-toplevel
  from dapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  from dapo_jax.train import trainer  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  workdir = os.path.abspath(FLAGS.workdir)
  os.makedirs(workdir, exist_ok=True)
  if jax.process_index() == 0:
    with open(os.path.join(workdir, "config.json"), "w", encoding="utf-8") as f:
      f.write(FLAGS.config.to_json_best_effort(indent=2))
  run = trainer.build(cfg, workdir, resume=FLAGS.resume)
  results = trainer.train(run, resume=FLAGS.resume)
  if cfg.checkpoint.export_hf:
    # Every process takes part (the params are gathered across hosts); process 0 writes.
    out = os.path.join(workdir, "export")
    hf_io.save_pretrained(nnx.merge(run.graphdef, run.state.params), run.model_config, out,
                          overwrite=True)
    if jax.process_index() == 0:
      run.task.tokenizer.save_pretrained(out)
      print(f"[export] HF checkpoint: {out}")
  if jax.process_index() == 0:
    k = cfg.eval.num_samples
    with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
      json.dump(results, f, indent=2)
    if "before" in results:
      print(f"[eval] before: avg@{k} {_fmt(results['before'], f'avg@{k}')}")
    print(f"[eval] after:  avg@{k} {_fmt(results['after'], f'avg@{k}')}")
    print(f"[logs] {workdir}/metrics.jsonl, tensorboard in {workdir}/tensorboard")


if __name__ == "__main__":
  app.run(main)
