"""The 32B recipe's code path at a width this CPU machine runs: a CPU rehearsal of the pod run.

configs/dapo_qwen25_32b.py with a fresh random model in Qwen2.5-32B's proportions (2 layers,
1/16 of the width, 1/4 of the heads: 5 query heads per KV head, head_dim 128 as in the 32B and
as the TPU paged kernel needs, MLP 5.4x the model width, untied embeddings), the DAPO-Math-17k
prompts in SmolLM2's ChatML chat template (its tokenizer: experiments/rehearse_pod.py writes it
from the shipped GGUF), bf16 compute over float32 master weights, a paged KV pool smaller than
the batch needs, packing, 16 mini-batch updates per rollout step, truncated IS correction, a
checkpoint every step, and the pod's mesh axes (fsdp x tensor) over 2 processes x 4 CPU devices.

COMMAND (the rehearsal: this loop on 2 processes, a resume, and the TPU kernels in interpret
mode against the reference path):
  python experiments/rehearse_pod.py --steps=3 --json=/tmp/rehearsal.json
EXPECTED: on 2026-12-04 on a 2-core Intel Xeon host, idle, the whole rehearsal took 9 min 29 s
  (loop steps of 67, 53 and 52 s, 24 samples preempted in each; figures: docs/scale.md). A
  random policy earns no reward, so advantages are 0 and the updates leave the policy as it
  was, bar weight decay; what is checked is the code
  path (mesh, pages, packing, IS weights, save/resume) and the numbers the kernels compute.

Options (`:key=value,...`): tokenizer (a directory holding a tokenizer with a chat template).
"""
from configs import dapo_qwen25_32b
from configs.base import parse_arg


def get_config(arg=None):
  opts = parse_arg(arg, tokenizer="runs/pod_rehearsal/tokenizer")
  c = dapo_qwen25_32b.get_config()
  c.model.source = "config"             # random weights of the shape below (no checkpoint)
  c.model.hf_path = ""
  c.model.vocab_size = 0                # tokens: the tokenizer's (49,152)
  c.model.hidden_size = 320             # channels: 1/16 of the 32B's 5,120
  c.model.intermediate_size = 1728      # channels: 1/16 of 27,648 (5.4x hidden)
  c.model.num_layers = 2                # (32B: 64)
  c.model.num_heads = 10                # 1/4 of 40: 5 query heads per KV head, as 40 / 8
  c.model.num_kv_heads = 2              # 1/4 of 8; splits over tensor = 2
  c.model.head_dim = 128                # channels (the TPU paged kernel's lane width)
  c.model.rope_theta = 1e6
  c.model.tie_word_embeddings = False
  c.model.logits_chunk = 256            # tokens per log-prob chunk
  c.task.tokenizer = opts["tokenizer"]  # SmolLM2's tokenizer: ChatML template, as Qwen's
  c.task.max_prompt_len = 56            # tokens, left-truncated (counted; the chat template's
                                        # closing and assistant markers are kept): 3 pages and
                                        # a partial one, so a response grows into a 2nd own page
  c.rollout.group_size = 4              # G (a mini-batch of 1 prompt x 4 splits over fsdp 4)
  c.rollout.max_new_tokens = 16         # tokens (L_max)
  c.rollout.num_slots = 32              # concurrent sequences, all hosts
  c.rollout.kv_cache_gib = 0.0003       # GiB per chip: 19 pages of 16 tokens per batch shard,
                                        # fewer than its 2 prompts' 3 shared pages + 8 rows x 2:
                                        # rows wait for pages, or are preempted when a shard
                                        # runs out (`sampler_preemptions` counts them)
  c.rollout.steps_per_call = 4          # decode steps per call: rows grow 4 tokens at a time
  c.algo.overlong_cache_len = 4         # tokens (L_cache)
  c.algo.dynamic_sampling = False       # a random policy's groups are all wrong: none kept
  c.algo.is_correction = "tis_token"    # truncated IS on the sampler's behaviour log-probs
  c.train.num_steps = 3                 # rollout steps
  c.train.batch_size = 16               # prompts: 16 mini-batches of 1 prompt x G = 4 sequences
  c.train.num_minibatches = 16
  c.train.micro_batch_size = None       # sequences per slice: the whole mini-batch
  c.optim.warmup_steps = 1              # rollout steps
  c.eval.every_steps = 0
  c.eval.num_samples = 2
  c.eval.num_problems = 4
  c.mesh.fsdp = -1                      # fsdp 4 x tensor 2 over 8 devices
  c.mesh.tensor = 2
  c.checkpoint.every_steps = 1          # rollout steps: every step can be resumed
  c.checkpoint.keep = 4
  c.checkpoint.async_save = False
  c.checkpoint.export_hf = False
  c.log.tensorboard = False
  c.log.progress = False
  c.distributed.enabled = False         # rehearse_pod.py starts the processes
  return c
