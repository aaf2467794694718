"""Builds a shipped base policy: a supervised warm start on the synthetic task.

DAPO starts from a pretrained base; offline there is none, so this script fits a tiny Qwen2 to a
few hundred batches of reference solutions or demonstrations (the --config's model, task and
warm_start fields) and exports it as an HF checkpoint. The main job then loads it with
`model.source = "hf"` and runs only RL. dapo_jax/assets/README.md says which snapshot of which
run each shipped base is, and why; to rebuild the tiny base (~15 min on 2 cores):

  python experiments/make_base_checkpoint.py --steps=1000 --save_every=100 --out=/tmp/base
  cp -r /tmp/base/step_600 dapo_jax/assets/tiny_base

and the testbed's (configs/testbed_cpu.py) with --config=configs/testbed_cpu.py:init=True.
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from flax import nnx  # noqa: E402

from dapo_jax import config as config_lib, sharding  # noqa: E402
from dapo_jax.models import hf_io  # noqa: E402
from dapo_jax.train import placement, setup, sft  # noqa: E402
from experiments.launch import load_module  # noqa: E402


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="configs/tiny_cpu.py:init=True",
                  help="config file[:arg] whose model, task and warm_start fields to use")
  ap.add_argument("--steps", type=int, required=True, help="supervised steps")
  ap.add_argument("--out", required=True, help="output HF checkpoint directory")
  ap.add_argument("--lr", type=float, default=None, help="default: the config's warm_start.lr")
  ap.add_argument("--save_every", type=int, default=0,
                  help="also write snapshots <out>/step_<n> every n steps (to pick a base)")
  args = ap.parse_args()
  path, _, arg = args.config.partition(":")
  c = load_module(path).get_config(arg or None)
  if c.model.source != "config":
    raise ValueError(f"--config: {args.config} loads a checkpoint (model.source="
                     f"{c.model.source!r}); pass its init=True form to build one from scratch")
  c.warm_start.steps = args.steps
  if args.lr is not None:
    c.warm_start.lr = args.lr
  cfg = config_lib.parse(c)
  mesh = placement.build_mesh(cfg)
  task = setup.load_task(cfg)
  model, mcfg = setup.build_model(cfg, mesh, task.tokenizer)
  graphdef, params = nnx.split(model)
  t0 = time.time()

  def snapshot(step, p):
    if args.save_every and step % args.save_every == 0 and step < cfg.warm_start.steps:
      out = os.path.join(args.out, f"step_{step}")
      hf_io.save_pretrained(nnx.merge(graphdef, p), mcfg, out)
      task.tokenizer.save_pretrained(out)

  params, losses = sft.warm_start(
      graphdef, params, task.train, task.tokenizer, steps=cfg.warm_start.steps,
      batch_size=cfg.warm_start.batch_size, lr=cfg.warm_start.lr,
      seq_len=cfg.task.max_prompt_len + cfg.rollout.max_new_tokens, eos_id=task.eos_ids[0],
      seed=cfg.seed, data_sharding=sharding.data_sharding(mesh), callback=snapshot,
      demo=setup.demo_fn(cfg))
  hf_io.save_pretrained(nnx.merge(graphdef, params), mcfg, args.out)
  task.tokenizer.save_pretrained(args.out)
  print(f"wrote {args.out}: {args.steps} steps in {time.time() - t0:.0f}s, final nll {losses[-1]:.4f}")


if __name__ == "__main__":
  main()
