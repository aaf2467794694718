"""The DAPO recipe on Qwen3-30B-A3B-Base: configs/dapo_qwen25_32b.py's settings on a mixture of
experts (48 layers, d = 2,048, 128 experts of which 8 per token, 30.5 B parameters, 3.3 B
active per token).

COMMAND (every worker of a Cloud TPU v5p-32 slice, 16 chips; the launcher prints it):
  python experiments/launch.py --config=configs/dapo_qwen3_30b_a3b.py --backend=tpu-pod \
      --tpu_name=my-v5p-32 --zone=us-east5-a --workdir=/nfs/runs/dapo30b --dry_run
  # which runs on each worker:
  python -m dapo_jax.main --config=configs/dapo_qwen3_30b_a3b.py:hf_path=/ckpt/Qwen3-30B-A3B-Base \
      --workdir=/nfs/runs/dapo30b
EXPECTED: not run here (no accelerator, no network for the checkpoint). Fit and cost on a TPU
  slice, checked on CPU (no weights needed: the architecture is the preset of the same name in
  dapo_jax/aot/shapes.py when the checkpoint directory is absent):
  python -m dapo_jax.aot --config=configs/dapo_qwen3_30b_a3b.py --topology=v5p-32 (docs/moe.md)
  Compiled for v5p-32 on 2026-12-03: does not fit (step peak 100.43 GiB per chip: the update's
  86.19 + the sampler's weights 14.24; the decode chunk out of memory at compile; JSON in
  experiments/results); v5p-64 (micro-batch 8) is the next slice to compile (docs/moe.md).
Routing replay is on: the sampler records every token's 8 experts in each of the 48 layers and
the old-log-prob pass and the update route by them (docs/moe.md).
"""
from configs import dapo_qwen25_32b
from configs.base import parse_arg


def get_config(arg=None):
  opts = parse_arg(arg, hf_path="/ckpt/Qwen3-30B-A3B-Base", steps=375)
  c = dapo_qwen25_32b.get_config(f"hf_path={opts['hf_path']},steps={opts['steps']}")
  c.model.logits_chunk = 2048           # tokens per log-prob chunk (V = 151,936)
  c.model.moe_impl = "grouped"          # ragged_dot over the tokens of each expert (XLA:TPU)
  c.model.routing_replay = True         # the trainer routes by the sampler's experts
  c.mesh.data = 1                       # 16 chips: fsdp 4 x tensor 4 (experts split over fsdp)
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  c.train.micro_batch_size = 4          # one sequence per batch shard (4 shards of 16 chips)
  return c
