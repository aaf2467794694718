"""The embedded default: a tiny Qwen2 policy on the synthetic task, DAPO on a 2-core CPU.

COMMAND:
  python -m dapo_jax.main --config=configs/tiny_cpu.py --workdir=runs/tiny_cpu
EXPECTED: ~4-6 min on 2 CPU cores (the machine's speed varies); held-out avg@16
  34.7% -> 55.3% (+20.6 points, 95% CIs in docs/recipes.md).
  Variant for CI and smoke tests (about a minute):
  python -m dapo_jax.main --config=configs/tiny_cpu.py:runlocal=True --workdir=runs/tiny_smoke
"""
from configs.base import base_config, parse_arg, runlocal


def get_config(arg=None):
  opts = parse_arg(arg, runlocal=False, ladder=False, init=False)
  c = base_config()
  # The shipped base policy (experiments/make_base_checkpoint.py); init=True: a fresh model with
  # the fields of configs/base.py, which that script warm-starts.
  if not opts["init"]:
    c.model.source = "hf"
    c.model.hf_path = "dapo_jax/assets/tiny_base"   # relative to the repo root
  c.model.scan_layers = False          # unrolled: updates ~15 % faster on CPU (docs/performance.md)
  c.task.difficulty = 3                # operations per problem (reasoning lines)
  c.task.max_prompt_len = 72           # tokens (the prompts are 66-70)
  c.warm_start.batch_size = 32         # sequences (used by make_base_checkpoint.py)
  c.warm_start.lr = 3e-3
  c.rollout.group_size = 16            # G (as the paper)
  c.rollout.max_new_tokens = 40        # tokens
  c.rollout.num_slots = 128
  c.algo.overlong_cache_len = 10       # tokens
  c.algo.gen_batch_size = 24           # prompts per round
  c.train.num_steps = 80               # rollout steps
  c.train.batch_size = 16              # prompts
  c.train.num_minibatches = 4          # updates per step (4 prompts x 16 per update)
  c.optim.lr = 5e-5                    # tuned on this task (1e-4: +17 points, 3e-4: worse)
  c.optim.warmup_steps = 2             # rollout steps
  c.eval.num_problems = 128
  c.eval.num_samples = 16
  c.checkpoint.every_steps = 10        # rollout steps (a preemption loses at most 10)
  if opts["ladder"]:                   # shorter runs: 6 rungs x 3 seeds + sweeps on 2 cores
    c.train.num_steps = 20             # rollout steps
    c.eval.num_problems = 64
    c.eval.num_samples = 8
    c.checkpoint.every_steps = 5       # rollout steps
  return runlocal(c) if opts["runlocal"] else c
