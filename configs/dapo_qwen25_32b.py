"""The paper's recipe: DAPO on Qwen2.5-32B base with DAPO-Math-17k, eval AIME-2024 avg@32.

COMMAND (every worker of a Cloud TPU v5p-128 pod, 64 chips; the launcher prints it, after the
fit check; docs/scale.md goes from an empty project to this):
  python experiments/launch.py --config=configs/dapo_qwen25_32b.py:hf_path=gs://BUCKET/Qwen2.5-32B \
      --set=task.data_dir=gs://BUCKET/data --backend=tpu-pod --tpu_name=my-v5p-128 \
      --zone=us-east5-a --accelerator_type=v5p-128 --queued_resource --setup \
      --workdir=gs://BUCKET/runs/dapo32b --dry_run
  # which runs on each worker (a bucket every worker reads; a local path would have to be one
  # file system mounted on all 16 workers):
  python -m dapo_jax.main --config=configs/dapo_qwen25_32b.py:hf_path=gs://BUCKET/Qwen2.5-32B \
      --workdir=gs://BUCKET/runs/dapo32b/run --config.task.data_dir=gs://BUCKET/data
EXPECTED: the paper reports AIME-24 avg@32 = 50 (verl's reproduction: 52) after ~6,000 gradient
  updates (its figures' "steps") = ~375 rollout steps; one step generates up to 512 x 16 x 20,480
  tokens. Not run here: this machine has no accelerator and no network for the checkpoint.
  Settings follow ../shared/PAPER.md. Fit and cost on a TPU slice, checked on CPU:
  python -m dapo_jax.aot --config=configs/dapo_qwen25_32b.py --topology=v5p-128 (docs/scale.md)
LoRA (`:lora=True`): rank-32 adapters on every projection (alpha 32), the base frozen in bf16, at
  10x the learning rate (1e-5); its slices are LORA_SLICES (`:lora=True,tpu=v5p-8`), e.g.
  python -m dapo_jax.aot --config=configs/dapo_qwen25_32b.py:lora=True,tpu=v5p-8 --topology=v5p-8
"""
from configs.base import base_config, parse_arg


def get_config(arg=None):
  # Paper Fig. 1 counts ~6,000 gradient updates = 375 rollout steps of 16 (docs/scale.md;
  # https://github.com/volcengine/verl/issues/795, https://github.com/volcengine/verl/issues/1643).
  opts = parse_arg(arg, hf_path="/ckpt/Qwen2.5-32B", steps=375, tpu="v5p-128", lora=False)
  c = base_config()
  c.model.source = "hf"                 # Qwen2.5-32B base: an HF checkpoint directory or gs:// URL
  c.model.hf_path = opts["hf_path"]
  c.model.dtype = "bfloat16"            # compute
  c.model.param_dtype = "float32"       # master weights (AdamW state is float32 too)
  c.model.remat = True
  c.model.logits_chunk = 2048           # tokens per log-prob chunk (V = 152,064)
  c.task.name = "dapo_math_17k"
  c.task.eval_name = "aime_2024"
  c.task.tokenizer = opts["hf_path"]    # the checkpoint's own tokenizer
  c.task.chat_template = True           # the reference: one user message in Qwen's ChatML template
  c.task.max_prompt_len = 2048          # tokens, left-truncated
  c.rollout.group_size = 16             # G
  c.rollout.max_new_tokens = 20480      # tokens (L_max)
  c.rollout.temperature = 1.0
  c.rollout.top_p = 1.0
  c.rollout.num_slots = 2048            # concurrent sequences, all hosts (128 per v5p-128 host)
  c.rollout.kv_cache_gib = 48.0         # GiB of KV page pool per chip: 786,432 tokens per host
  c.rollout.page_size = 16              # tokens per KV page
  c.algo.eps_low = 0.2
  c.algo.eps_high = 0.28
  c.algo.clip_c = 10.0                  # dual-clip, as the reference run
  c.algo.loss_agg = "token-mean"
  c.algo.overlong_penalty = True
  c.algo.overlong_filter = False
  c.algo.overlong_cache_len = 4096      # tokens (L_cache): ramp 16,384 -> 20,480
  c.algo.dynamic_sampling = True
  c.algo.gen_batch_size = 1536          # prompts per generation round
  c.algo.max_gen_rounds = 10
  c.algo.kl_coef = 0.0
  # Not in the paper: truncated IS per token on the bf16 sampler's log-probs. Measured on
  # SmolLM2-135M (docs/async.md, "bf16 sampler"): KL(sampler || trainer) ~1e-3 nats a token,
  # |dlogp| p99 0.16, no token past the cap; per-sequence ratios would be off by tens of nats at
  # 20k tokens. --config.algo.is_correction=none runs the paper's loss exactly.
  c.algo.is_correction = "tis_token"
  c.algo.is_cap = 2.0
  c.train.num_steps = opts["steps"]     # rollout steps (16 gradient updates each)
  c.train.batch_size = 512              # prompts
  c.train.num_minibatches = 16          # 32 prompts x 16 = 512 responses per update
  c.train.micro_batch_size = 16         # sequences per accumulation slice (1 per batch shard)
  c.optim.lr = 1e-6
  c.optim.warmup_steps = 20             # rollout steps (paper; the script uses 10)
  c.optim.weight_decay = 0.1
  c.optim.grad_clip = 1.0
  c.eval.every_steps = 5                # rollout steps
  c.eval.num_samples = 32               # avg@32
  c.eval.num_problems = 0               # all 30 AIME-24 problems
  c.eval.temperature = 1.0
  c.eval.top_p = 0.7
  c.mesh.data = 1                       # 64 chips: fsdp 16 x tensor 4
  c.mesh.fsdp = -1
  c.mesh.tensor = 4
  c.checkpoint.every_steps = 10         # rollout steps
  c.checkpoint.keep = 3
  c.distributed.enabled = True          # TPU pod: coordinator found from the environment
  if opts["lora"]:
    c.lora.update(rank=32, alpha=32.0)  # every projection (configs/base.py's targets)
    c.model.param_dtype = "bfloat16"    # the frozen base (the adapters are float32)
    c.optim.lr = 1e-5                   # 10x the full-weight recipe's (not tuned)
  _fit_slice(c, opts["tpu"], LORA_SLICES if opts["lora"] else SLICES)
  return c


# The settings that fit the recipe on each slice, by compilation (python -m dapo_jax.aot
# --config=configs/dapo_qwen25_32b.py:tpu=SLICE --topology=SLICE; docs/scale.md).
SLICES = {
    "v5p-128": {},                        # the settings above: fsdp 16 x tensor 4, bf16 sampler
    # 32 GiB chips: the recipe's mesh as on v5p-128 (fsdp 16 x tensor 4, one row per chip), an
    # 8 GiB KV pool per chip (131,072 tokens per host); no context parallelism needed.
    "v6e-64": {"rollout.kv_cache_gib": 8.0},
    # 32 GiB chips, half the slice: the train state alone is 11.45 GiB per chip, so each row's
    # tokens over 4 chips (micro-batches of 2 rows), int8 sampler weights, a 6 GiB KV pool.
    "v6e-32": {"mesh.context": 4, "train.micro_batch_size": 2,
               "rollout.weight_dtype": "int8", "rollout.kv_cache_gib": 6.0},
    # 16 GiB chips: each row's tokens over 4 chips (one row of 22,528 tokens per chip does not
    # fit the update), int8 sampler weights, a 4 GiB KV pool per chip (65,536 tokens per host).
    "v5e-256": {"mesh.context": 4, "train.micro_batch_size": 16,
                "rollout.weight_dtype": "int8", "rollout.kv_cache_gib": 4.0},
}


# The LoRA recipe's slices (`:lora=True,tpu=...`), by compilation likewise.
LORA_SLICES = {
    "v5p-128": {},
    # One host, 4 chips: fsdp 1 x tensor 4, one row per micro-batch (the one batch shard), int8
    # sampler weights, a 16 GiB KV pool per chip (262,144 tokens).
    "v5p-8": {"train.micro_batch_size": 1, "rollout.weight_dtype": "int8",
              "rollout.kv_cache_gib": 16.0, "distributed.enabled": False},
    # One host, 8 chips of 32 GiB: fsdp 1 x tensor 4 x context 2 (each row's tokens over 2
    # chips), one row per micro-batch, int8 sampler weights, a 6 GiB KV pool per chip, 256
    # slots (the pool holds ~100 rows at these lengths; the prefill batch is slots / 16).
    "v6e-8": {"mesh.context": 2, "train.micro_batch_size": 1, "rollout.weight_dtype": "int8",
              "rollout.kv_cache_gib": 6.0, "rollout.num_slots": 256,
              "distributed.enabled": False},
}


def _fit_slice(c, tpu: str, slices: dict):
  if tpu not in slices:
    raise ValueError(f"config arg tpu: {tpu!r} has no fitted settings; known: {sorted(slices)}")
  for path, value in slices[tpu].items():
    section, field = path.split(".")
    c[section][field] = value
