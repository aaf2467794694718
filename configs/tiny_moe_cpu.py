"""A tiny Qwen3-MoE policy on the synthetic task: configs/tiny_cpu.py's DAPO recipe, with every
layer's MLP a mixture of 4 experts (top-2, normalised gate weights), on a 2-core CPU.

COMMAND:
  python -m dapo_jax.main --config=configs/tiny_moe_cpu.py --workdir=runs/tiny_moe
EXPECTED: ~10 min on 2 idle CPU cores; held-out avg@16 36.5% -> 66.0% (2026-12-03, one seed;
  docs/moe.md). The base policy is dapo_jax/assets/tiny_moe_base (dapo_jax/assets/README.md
  says how it was made). Variant for smoke tests (about a minute):
  python -m dapo_jax.main --config=configs/tiny_moe_cpu.py:runlocal=True --workdir=runs/moe_smoke
"""
from configs import tiny_cpu
from configs.base import parse_arg, runlocal


def get_config(arg=None):
  opts = parse_arg(arg, runlocal=False, init=False, difficulty=3)
  c = tiny_cpu.get_config("init=True")  # the dense demo's task, rollout and RL settings
  c.task.difficulty = opts["difficulty"]  # operations per problem (experiments/base_rate.py)
  # The shipped base policy (experiments/make_base_checkpoint.py with init=True: a fresh model
  # with the fields below, which that script warm-starts).
  if not opts["init"]:
    c.model.source = "hf"
    c.model.hf_path = "dapo_jax/assets/tiny_moe_base"  # relative to the repo root
  c.model.num_experts = 4              # experts per layer (every layer is MoE)
  c.model.num_experts_per_tok = 2      # k
  c.model.moe_intermediate_size = 128  # channels per expert (2 active: 256 vs the dense 384)
  c.model.norm_topk_prob = True
  c.model.moe_impl = "dense"           # 4 experts on CPU: all-experts beats ragged_dot (docs)
  c.model.routing_replay = True        # the trainer routes each token by the sampler's experts
  return runlocal(c) if opts["runlocal"] else c
