"""The full field set of a dapo_jax run, with the DAPO recipe's algorithm settings.

Not a runnable config on its own: configs/tiny_cpu.py, configs/dapo_qwen25_32b.py and
configs/ladder.py start from `base_config()` and override what differs. Every field carries its
unit; dapo_jax.config.parse() rejects unknown keys and out-of-range values.
"""
import ml_collections
from ml_collections import config_dict


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0

  c.model = dict(
      source="config",          # "config" = init from these fields | "hf" = load hf_path
      hf_path="",               # HF checkpoint directory: local, or a URL (gs://...)
      vocab_size=0,             # tokens; 0 = the tokenizer's vocabulary
      hidden_size=128,          # channels
      intermediate_size=384,    # channels (SwiGLU)
      num_layers=3,
      num_heads=4,
      num_kv_heads=2,
      head_dim=32,              # channels per head
      rope_theta=10000.0,
      tie_word_embeddings=True,
      dtype="float32",
      param_dtype="float32",
      remat=False,
      scan_layers=True,         # lax.scan over layers (False: unrolled; faster on CPU, compiles per layer)
      logits_chunk=512,         # tokens per log-prob chunk
      attention_impl="auto",    # training attention: splash on TPU, gpu_flash on GPU, blocked elsewhere (models/attention.py)
      attention_chunk=256,      # positions per attention block (blocked: causal skipping)
      num_experts=0,            # experts per MoE layer (Qwen3-MoE); 0 = dense MLP (Qwen2)
      num_experts_per_tok=2,    # experts per token (k); used when num_experts > 0
      moe_intermediate_size=128,  # channels of each expert's SwiGLU; used likewise
      norm_topk_prob=True,      # gate weights: the k router probabilities renormalised to sum 1
      moe_impl="grouped",       # experts: grouped (ragged_dot, TPU) | dense (all experts; small E on CPU)
      routing_replay=False,     # MoE: the trainer routes each token by the sampler's experts (bool)
  )
  c.task = dict(
      name="synthetic",
      difficulty=3,             # operations per synthetic problem (reasoning lines)
      difficulty_max=0,         # 0 = all at difficulty; else drawn from [difficulty, this]
      num_train=20000,          # prompts in the synthetic training pool
      shots=0,                  # worked examples in each prompt (arith_nl only)
      eval_name="synthetic_heldout",
      tokenizer="synthetic",
      chat_template=False,      # prompt = one user message in the tokenizer's chat template
      max_prompt_len=96,        # tokens (left-truncated beyond)
      reward="math_answer",
      data_dir="",              # "" = ../shared/data beside the repo; a URL (gs://...) works
      skip_bad=False,           # True: skip and count bad data rows ([data] line) instead of stopping
  )
  c.warm_start = dict(steps=0, batch_size=64, lr=1e-3,  # steps, sequences, lr
                      # demonstrations (data/testbed.py), probabilities per reasoning line;
                      # all 0 = the exact reference solutions
                      error_rate=0.0, recheck_rate=0.0, loop_rate=0.0, spacing=0.0)
  c.rollout = dict(
      group_size=16,            # G responses per prompt
      max_new_tokens=48,        # tokens (L_max)
      temperature=1.0,
      top_p=1.0,
      top_k=0,
      num_slots=128,            # concurrent sequences (paged: all hosts; dense: per host)
      kv_cache_gib=0.0,         # GiB of KV cache per chip; 0 = every slot at full length
      paged_kv=True,            # page pool + page tables; False = dense per-slot cache
      page_size=16,             # tokens per KV page
      weight_dtype="auto",      # sampler weights: auto (= model.dtype) | bfloat16 | float32 | int8
      steps_per_call=16,        # decode steps per device call (pages grow by this many tokens)
      max_staleness=0,          # policy versions; 0 = synchronous (sample, train, sync)
      partial=False,            # in-flight sequences continue across weight syncs (staleness >= 1)
      placement="colocated",    # colocated | split (the sampler on its own devices)
      sampler_devices=0.0,      # split: devices (>= 1) or a fraction of them; 0 = colocated
  )
  c.algo = dict(                # DAPO (paper §3, reference script)
      eps_low=0.2,
      eps_high=0.28,
      clip_c=10.0,              # dual-clip; 0 = off
      loss_mode="dapo",         # core.loss_modes.MODES (gspo, cispo, sapo, ...)
      loss_agg="token-mean",
      loss_scale_factor=config_dict.placeholder(float),  # tokens; None = rollout.max_new_tokens
      # Each loss mode's own knobs, a section per mode (policy_loss keywords); None = the paper
      # default in core.loss_modes.MODES. Set one with --config.algo.mode_params.sapo.tau_pos=0.5.
      mode_params=dict(
          sapo=dict(tau_pos=config_dict.placeholder(float),   # gate temperature, A > 0
                    tau_neg=config_dict.placeholder(float)),  # gate temperature, A < 0
          clip_cov=dict(clip_cov_ratio=config_dict.placeholder(float),  # share of tokens detached
                        clip_cov_lb=config_dict.placeholder(float),     # covariance band, lower
                        clip_cov_ub=config_dict.placeholder(float)),    # covariance band, upper
          kl_cov=dict(kl_cov_ratio=config_dict.placeholder(float),  # share given the KL term
                      kl_coef=config_dict.placeholder(float)),      # coefficient of |log r|
      ),
      is_correction="none",     # off-policy correction: none | tis_token | tis_seq | mask_token | mask_seq
      is_cap=2.0,               # IS weight cap (tis) / band [1/cap, cap] (mask)
      # verl's rollout correction (core.offpolicy), exclusive with is_correction:
      rollout_is="none",        # IS weights: none | token | sequence
      rollout_is_threshold="2.0",  # "u" truncates at u (TIS); "l_u" zeroes outside [l, u] (IcePop)
      rollout_rs="none",        # rejection: none | comma list, e.g. "token_k1,seq_mean_k3"
      rollout_rs_threshold="2.0",  # one shared or one per option; k1: "l_u" or u = [1/u, u]
      adv_scale_by_std=True,
      adv_eps=1e-6,
      overlong_filter=False,
      overlong_penalty=True,
      overlong_cache_len=12,    # tokens (L_cache); ramp from max_new_tokens - this
      overlong_factor=1.0,
      overlong_adaptive=False,  # ramp start = a percentile of recent lengths (core.overlong)
      overlong_adaptive_percentile=90.0,  # percent of recent response lengths
      overlong_adaptive_window=4,  # rollout steps
      dynamic_sampling=True,
      gen_batch_size=24,        # prompts per generation round
      max_gen_rounds=10,
      prefilter=False,          # skip prompts whose record is all-correct / all-wrong
      prefilter_decay=0.8,      # weight kept by a prompt's past observations per new one
      prefilter_min_seen=2,     # times sampled before a prompt can be skipped
      prefilter_margin=0.0,     # decayed pass rate <= this or >= 1 - this counts as uniform
      prefilter_revisit=0.1,    # probability a skippable prompt is sampled anyway
      kl_coef=0.0,
      kl_kind="k3",
      entropy_coef=0.0,
      router_aux_coef=0.0,      # MoE: + coef x the router's load-balancing loss (HF: 0.001)
      old_logp_source="recompute",
  )
  c.train = dict(
      num_steps=20,             # rollout steps
      batch_size=16,            # prompts (groups) per step
      num_minibatches=4,        # optimizer updates per step
      micro_batch_size=config_dict.placeholder(int),  # sequences per slice; None = whole mini-batch
      packing=True,             # sequences packed into rows of seq_len tokens (padding-free update)
      max_bad_steps=3,          # consecutive non-finite updates before stopping
      entropy_floor=0.05,       # nats
      entropy_ceiling=4.0,      # nats
      length_growth_warn=3.0,   # x step-1 mean length
  )
  c.optim = dict(lr=1e-6, warmup_steps=20, weight_decay=0.1, grad_clip=1.0, b1=0.9, b2=0.999,
                 eps=1e-8)        # warmup in rollout steps
  c.eval = dict(
      every_steps=0,            # rollout steps; 0 = before and after training only
      num_samples=16,           # k
      num_problems=64,          # 0 = all
      temperature=1.0,
      top_p=0.7,
      bootstrap_samples=1000,
  )
  c.mesh = dict(data=-1, fsdp=1, tensor=1, context=1)  # devices per axis; -1 = the rest;
  #   context: each row's tokens split over that many devices (docs/scale.md)
  c.lora = dict(rank=0,               # LoRA adapters of this rank; 0 = full-weight training
                alpha=32.0,           # adapter output scale alpha / rank
                targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")  # PEFT names
  c.checkpoint = dict(every_steps=0, keep=2, async_save=True, export_hf=True)
  c.log = dict(tensorboard=True, progress=True,
               reflection_phrases="",  # comma-separated re-check phrases; "" = tracker off
               wandb=False,            # a Weights & Biases run too (pip install wandb)
               wandb_project="dapo_jax",
               wandb_entity="",        # "" = wandb's default entity
               wandb_name="")          # run name; "" = the workdir's basename
  c.distributed = dict(enabled=False, coordinator_address="", num_processes=-1, process_id=-1,
                       cpu_collectives="")
  return c


def runlocal(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The smoke-test sizes of a CPU config (its `runlocal=True`): 2 steps, a small eval."""
  c.train.num_steps = 2
  c.eval.num_problems = 16
  c.eval.num_samples = 4
  c.eval.bootstrap_samples = 100
  return c


def parse_arg(arg: str | None, **defaults) -> dict:
  """'a=1,b=x' -> {'a': 1, 'b': 'x'} typed like `defaults`; unknown keys are errors."""
  out = dict(defaults)
  for item in filter(None, (arg or "").split(",")):
    if "=" not in item:
      raise ValueError(f"config arg: expected key=value, got {item!r}")
    k, v = item.split("=", 1)
    if k not in defaults:
      raise ValueError(f"config arg: unknown option {k!r}; known: {sorted(defaults)}")
    d = defaults[k]
    if isinstance(d, bool):
      if v not in ("True", "False", "true", "false", "1", "0"):
        raise ValueError(f"config arg {k}: expected a bool, got {v!r}")
      out[k] = v in ("True", "true", "1")
    else:
      out[k] = type(d)(v)
  return out
