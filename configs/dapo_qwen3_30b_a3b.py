"""The DAPO recipe on Qwen3-30B-A3B-Base: configs/dapo_qwen25_32b.py's settings on a mixture of
experts (48 layers, d = 2,048, 128 experts of which 8 per token, 30.5 B parameters, 3.3 B
active per token).

COMMAND (every worker of a Cloud TPU v5p-64 slice, 32 chips; the launcher prints it):
  python experiments/launch.py --config=configs/dapo_qwen3_30b_a3b.py --backend=tpu-pod \
      --tpu_name=my-v5p-64 --zone=us-east5-a --accelerator_type=v5p-64 \
      --workdir=gs://BUCKET/runs/dapo30b --dry_run
  # which runs on each worker:
  python -m dapo_jax.main --config=configs/dapo_qwen3_30b_a3b.py:hf_path=gs://BUCKET/Qwen3-30B-A3B-Base \
      --workdir=gs://BUCKET/runs/dapo30b
EXPECTED: not run here (no accelerator, no network for the checkpoint). Fit and cost on a TPU
  slice, checked on CPU (no weights needed: the architecture is the preset of the same name in
  dapo_jax/aot/shapes.py when the checkpoint directory is absent):
  python -m dapo_jax.aot --config=configs/dapo_qwen3_30b_a3b.py --topology=v5p-64 (docs/moe.md)
  Compiled on 2026-12-03: v5p-64 fits (step peak 86.51 GiB per chip, in the decode chunk);
  v5p-32 does not (the update alone peaks at 86.19 GiB, beside the sampler's 14.24). JSONs in
  experiments/results.
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
  c.mesh.data = 1                       # 32 chips: fsdp 8 x tensor 4 (experts split over fsdp)
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  c.train.micro_batch_size = 8          # one sequence per batch shard (8 shards of 32 chips);
                                        # 4 per shard ran out of memory on v5p-32 (docs/moe.md)
  return c
