"""The ablation testbed: the synthetic task with mixed difficulty and a base policy
warm-started on imperfect demonstrations, so that each DAPO technique has something to act on.

data/testbed.py says which knob exercises which technique; dapo_jax/assets/README.md has the
base's measured truncation rate, entropy and group-accuracy shares. configs/ladder.py runs the
Table-1 rungs and the sweeps on it (its default base).

COMMAND:
  python -m dapo_jax.main --config=configs/testbed_cpu.py --workdir=runs/testbed
COMMAND (rebuild the shipped base, dapo_jax/assets/testbed_base):
  python experiments/make_base_checkpoint.py --config=configs/testbed_cpu.py:init=True \
      --steps=1600 --save_every=200 --out=/tmp/testbed_base
EXPECTED: ~3.5 min a run on 2 cores (two at a time); experiments/results/README.md has the
  ladder's and sweeps' runtimes and outcomes.
  Smoke variant: --config=configs/testbed_cpu.py:runlocal=True
"""
from configs.base import base_config, parse_arg, runlocal


def get_config(arg=None):
  opts = parse_arg(arg, runlocal=False, init=False)
  c = base_config()
  if not opts["init"]:                 # init=True: a fresh model, for make_base_checkpoint.py
    c.model.source = "hf"
    c.model.hf_path = "dapo_jax/assets/testbed_base"   # relative to the repo root
  c.model.scan_layers = False          # unrolled: updates ~15 % faster on CPU (docs/performance.md)
  c.task.difficulty = 2                # operations per problem: equal shares of 2, 3, 4, 5
  c.task.difficulty_max = 5
  c.task.num_train = 4000              # prompts (1,000 per level; 2 operations has ~1,700)
  c.task.max_prompt_len = 76           # tokens (the prompts are 68-74)
  c.warm_start.batch_size = 32         # sequences
  c.warm_start.lr = 3e-3
  c.warm_start.error_rate = 0.03       # per reasoning line (data/testbed.py)
  c.warm_start.recheck_rate = 0.15
  c.warm_start.loop_rate = 0.02
  c.warm_start.spacing = 0.5
  c.rollout.group_size = 16            # G (as the paper)
  c.rollout.max_new_tokens = 64        # tokens (L_max)
  c.rollout.num_slots = 128
  c.algo.overlong_cache_len = 16       # tokens (L_max / 4; the paper: 4,096 of 20,480, 1/5)
  c.algo.gen_batch_size = 24           # prompts per round
  c.train.num_steps = 30               # rollout steps
  c.train.batch_size = 16              # prompts
  c.train.num_minibatches = 4          # updates per step (4 prompts x 16 per update)
  c.train.micro_batch_size = 16        # sequences per slice (exact accumulation; faster on CPU)
  c.optim.lr = 2e-4                    # per-step moves large enough for the clips to bind
  c.optim.warmup_steps = 2             # rollout steps
  c.eval.num_problems = 256
  c.eval.num_samples = 8
  c.checkpoint.every_steps = 10        # rollout steps
  c.log.reflection_phrases = "check"   # the demonstrations' re-check marker
  return runlocal(c) if opts["runlocal"] else c
