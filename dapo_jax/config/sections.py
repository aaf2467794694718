"""The sections of a run's configuration: one frozen dataclass each, every field with its unit.

`dapo_jax.config.Config` holds one of each; `dapo_jax.config.parse` builds them from a
ConfigDict with exactly these keys (configs/base.py lists every field with its default).
"""
import dataclasses

from dapo_jax.core import losses as core_losses


# ((mode, ((knob, value), ...)), ...), sorted: a hashable form of algo.mode_params.
ModeParams = tuple[tuple[str, tuple[tuple[str, float | None], ...]], ...]


@dataclasses.dataclass(frozen=True)
class ModelCfg:
  source: str                 # "config" (init from the fields below) | "hf" (load hf_path)
  hf_path: str                # HF checkpoint dir when source == "hf": local or a URL (gs://...)
  vocab_size: int             # tokens; 0 = take the tokenizer's vocabulary size
  hidden_size: int            # channels
  intermediate_size: int      # channels of the SwiGLU MLP
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int               # channels per head
  rope_theta: float
  tie_word_embeddings: bool
  dtype: str                  # compute dtype: float32 | bfloat16
  param_dtype: str            # float32 | bfloat16
  remat: bool                 # rematerialise layer activations in the training forward
  scan_layers: bool           # full-sequence passes: layers under lax.scan (compile time flat in
                              # depth) or unrolled (False: ~15 % faster updates on CPU)
  logits_chunk: int           # tokens per chunk of the chunked log-prob computation
  attention_impl: str         # training attention: auto (splash on TPU, gpu_flash on GPU, else blocked) | blocked | splash | gpu_flash | plain
  attention_chunk: int        # positions per attention block (blocked / plain training attention)
  # Mixture of experts (Qwen3-MoE, models/moe.py), for source == "config"; a checkpoint has its own.
  num_experts: int            # experts per MoE layer; 0 = a dense MLP (the Qwen2 family)
  num_experts_per_tok: int    # k: experts each token is routed to
  moe_intermediate_size: int  # channels of each expert's SwiGLU
  norm_topk_prob: bool        # gate weights: the k router probabilities renormalised to sum 1
  moe_impl: str               # expert computation: grouped (ragged_dot) | dense (every expert)
  routing_replay: bool        # the sampler records each token's experts, the trainer routes by them


# How each ModelCfg field reaches the model (tests/test_aot.py fails on an unlisted field):
# SOURCE_FIELDS pick where weights come from; ARCH_FIELDS are the architecture, from the config
# (source="config") or from the checkpoint's config.json (source="hf": vocab_size must then be
# 0 or equal, and the others may not be set on the command line: config.checks.check_overrides);
# RUN_FIELDS are run settings applied to the model whatever the source (train/setup.py).
SOURCE_FIELDS = ("source", "hf_path")
ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
               "num_kv_heads", "head_dim", "rope_theta", "tie_word_embeddings", "num_experts",
               "num_experts_per_tok", "moe_intermediate_size", "norm_topk_prob")
TRAINER_FIELDS = ("routing_replay",)  # read by the run (sampler, batch), not the model
RUN_FIELDS = ("dtype", "param_dtype", "remat", "scan_layers", "logits_chunk", "attention_impl",
              "attention_chunk", "moe_impl")


@dataclasses.dataclass(frozen=True)
class TaskCfg:
  name: str                   # "synthetic" | "arith_nl" | "dapo_math_17k"
  difficulty: int             # synthetic task: number of operations (reasoning lines)
  difficulty_max: int         # synthetic task: 0 = all at `difficulty`; else each problem's
                              # operations drawn from [difficulty, difficulty_max]
  num_train: int              # synthetic task: prompts in the training pool
  shots: int                  # arith_nl: worked examples before each problem; 0 = none
  eval_name: str              # "synthetic_heldout" | "aime_2024" | "aime_2025" | "amc_2023" | "math_500"
  # eval_name may also be "math_500_int": data.integerize, MATH-500's answers made integers,
  # or "math_500_easy": MATH-500's integer-answer problems of levels 1-2
  tokenizer: str              # "synthetic" (built in the workdir) | path to an HF tokenizer dir
  chat_template: bool         # wrap each prompt as one user message in the tokenizer's chat template
  max_prompt_len: int         # tokens; longer prompts are left-truncated (counted)
  reward: str                 # key of dapo_jax.rewards.REWARD_FNS
  data_dir: str               # "" = the shared data dir beside the repo; may be a URL (gs://...)
  skip_bad: bool              # skip (and count) bad data rows instead of stopping at the first


@dataclasses.dataclass(frozen=True)
class WarmStartCfg:
  steps: int                  # supervised steps on reference solutions before RL; 0 = none
  batch_size: int             # sequences per supervised step
  lr: float
  # Demonstrations instead of exact references (data/testbed.py; synthetic task), per line:
  error_rate: float           # probability the result is off by 1 or 2
  recheck_rate: float         # probability of a "check:" line recomputing it
  loop_rate: float            # probability the response repeats it to the limit
  spacing: float              # probability of a space at each gap around an operator


@dataclasses.dataclass(frozen=True)
class RolloutCfg:
  group_size: int             # G: responses per prompt
  max_new_tokens: int         # tokens: the generation limit (L_max of Eq. 13)
  temperature: float
  top_p: float
  top_k: int                  # 0 = off
  # Concurrent sequences. Paged: the decode batch of all hosts together (num_slots / hosts each),
  # admission bounded by free pages; dense: most slots per host, capped by kv_cache_gib.
  num_slots: int
  kv_cache_gib: float         # GiB of KV cache per chip: paged, the page pool (0 = every slot at
                              # full length); dense, sizing the slots (0 = num_slots)
  paged_kv: bool              # paged KV cache (page pool + page tables); False = dense per slot
  page_size: int              # tokens per KV page
  weight_dtype: str           # the sampler's weights (models/quant.py): auto (= model.dtype) |
                              # bfloat16 | float32 | int8 (layer projections, per channel)
  steps_per_call: int         # most decode steps per device call: the host's round-trip and the
                              # paged pool's growth step (a partial rollout's sync points)
  # Rollout and training at the same time (train/pipeline.py, docs/rollout.md):
  max_staleness: int          # policy versions a trained token may lag the one that sampled it;
                              # 0 = the synchronous loop (sample, then train, then sync)
  partial: bool               # unfinished sequences continue across a weight sync (their later
                              # tokens carry the newer version); needs max_staleness >= 1
  placement: str              # "colocated" (sampler and trainer share every device) | "split"
  sampler_devices: float      # split: the sampler's devices, a count (>= 1) or a fraction in
                              # (0, 1) of all devices; the trainer gets the rest. 0 = colocated


@dataclasses.dataclass(frozen=True)
class AlgoCfg:
  eps_low: float
  eps_high: float
  clip_c: float               # dual-clip constant; 0 = off (a CLI override cannot pass None)
  loss_mode: str              # one of core.loss_modes.MODES: dapo | gspo | cispo | sapo | ...
  loss_agg: str               # one of core.losses.AGG_MODES
  loss_scale_factor: float | None  # tokens, seq-mean-token-sum-norm divisor; None = max_new_tokens
  # Each loss mode's own knobs, one section per mode (core.loss_modes.MODE_KNOBS: sapo.tau_pos,
  # kl_cov.kl_coef, ...), named as policy_loss's keywords; None = the paper default.
  mode_params: ModeParams
  is_correction: str          # core.offpolicy.IS_KINDS: none | tis_token | tis_seq | mask_*
  is_cap: float               # IS weight cap (tis_*) / band [1/cap, cap] (mask_*); > 1
  # verl's rollout-correction family (core.offpolicy.is_weights / rejection_mask), instead of
  # is_correction: IS level none | token | sequence with its threshold ("2.0" truncates, "0.5_2.0"
  # is IcePop's band), and rejection options (comma list of core.offpolicy.RS_OPTIONS) with one
  # threshold shared or one per option.
  rollout_is: str
  rollout_is_threshold: str
  rollout_rs: str
  rollout_rs_threshold: str
  adv_scale_by_std: bool      # False = Dr. GRPO (R − mean)
  adv_eps: float
  overlong_filter: bool       # mask truncated responses out of the loss
  overlong_penalty: bool      # add Eq. 13's soft penalty to the reward
  overlong_cache_len: int     # tokens (L_cache); the ramp starts at max_new_tokens − this
  overlong_factor: float
  overlong_adaptive: bool     # Eq. 13's ramp start from recent lengths (core.overlong)
  overlong_adaptive_percentile: float  # percent; the ramp starts at this percentile of lengths
  overlong_adaptive_window: int  # rollout steps of response lengths the percentile is taken over
  dynamic_sampling: bool      # keep only groups with 0 < #correct < G, over-generate to fill
  gen_batch_size: int         # prompts per generation round when dynamic_sampling
  max_gen_rounds: int         # rounds before a DynamicSamplingError
  prefilter: bool             # skip prompts recorded as all-correct/all-wrong (train.prefilter)
  prefilter_decay: float      # in (0, 1]: weight kept by past observations at each new one
  prefilter_min_seen: int     # times a prompt was sampled before it can be skipped
  prefilter_margin: float     # skip when the decayed pass rate is <= this or >= 1 - this
  prefilter_revisit: float    # probability a skippable prompt is sampled anyway
  kl_coef: float              # 0 = no reference model, nothing computed
  kl_kind: str                # k1 | k2 | k3
  entropy_coef: float         # entropy bonus; 0 = off
  router_aux_coef: float      # MoE: weight of the router's load-balancing loss; 0 = off
  old_logp_source: str        # "recompute" (trainer forward, as the reference) | "sampler"

  def corrects_off_policy(self) -> bool:
    """Whether the loss weighs or masks tokens by the sampler's log-probs (is_correction, or
    verl's family: rollout_is / rollout_rs); the mini-batch then carries behav_logp_BxS."""
    return any(v != "none" for v in (self.is_correction, self.rollout_is, self.rollout_rs))

  def loss_params(self) -> dict:
    """The keywords of core.losses.policy_loss for this loss mode: the shared clip fields
    (eps_low, eps_high, clip_c; 0 = no dual clip) and the mode's own knobs from mode_params."""
    own = dict(dict(self.mode_params).get(self.loss_mode, ()))
    names = ("eps_low", "eps_high", *core_losses.MODES[self.loss_mode].defaults)
    params = {k: own[k] if k in own else getattr(self, k) for k in dict.fromkeys(names)}
    if "clip_c" in params:
      params["clip_c"] = self.clip_c or None
    return params


@dataclasses.dataclass(frozen=True)
class TrainCfg:
  num_steps: int              # rollout steps
  batch_size: int             # prompts (groups) per rollout step
  num_minibatches: int        # optimizer updates per rollout step
  micro_batch_size: int | None  # sequences per gradient-accumulation slice; None = whole mini-batch
  packing: bool               # pack sequences into rows of seq_len (train/packing.py); False = one per row
  max_bad_steps: int          # consecutive non-finite updates (skipped) before the run stops
  entropy_floor: float        # nats; warn below (entropy collapse)
  entropy_ceiling: float      # nats; warn above (entropy explosion)
  length_growth_warn: float   # warn when mean length exceeds this multiple of step 1's


@dataclasses.dataclass(frozen=True)
class OptimCfg:
  lr: float
  warmup_steps: int           # rollout steps of linear warm-up (converted to optimizer updates)
  weight_decay: float
  grad_clip: float            # global norm; 0 = off
  b1: float
  b2: float
  eps: float


@dataclasses.dataclass(frozen=True)
class EvalCfg:
  every_steps: int            # rollout steps; 0 = only before and after training
  num_samples: int            # k of avg@k / pass@k / maj@k
  num_problems: int           # 0 = the whole eval set
  temperature: float
  top_p: float
  bootstrap_samples: int      # resamples for the 95 % CIs


@dataclasses.dataclass(frozen=True)
class MeshCfg:
  data: int                   # devices; -1 = the rest
  fsdp: int
  tensor: int
  context: int = 1            # context parallelism: each row's tokens split over this many


@dataclasses.dataclass(frozen=True)
class LoraCfg:
  rank: int                   # adapter rank r; 0 = full-weight training (no adapters)
  alpha: float                # the adapters' output is scaled by alpha / rank
  targets: str                # comma-separated PEFT module names (models/lora.py: TARGETS)


@dataclasses.dataclass(frozen=True)
class CheckpointCfg:
  every_steps: int            # rollout steps; 0 = only at the end
  keep: int                   # most recent checkpoints kept
  async_save: bool
  export_hf: bool             # write the final policy as an HF safetensors dir


@dataclasses.dataclass(frozen=True)
class LogCfg:
  tensorboard: bool
  progress: bool              # one console line per step
  reflection_phrases: str     # comma-separated re-check phrases (rewards.reflection); "" = off
  wandb: bool                 # the same scalars to a Weights & Biases run (metrics_wandb)
  wandb_project: str
  wandb_entity: str           # "" = wandb's default entity
  wandb_name: str             # the run's display name; "" = the workdir's basename


@dataclasses.dataclass(frozen=True)
class DistributedCfg:
  enabled: bool               # call jax.distributed.initialize
  coordinator_address: str    # "" = from the environment (TPU pods find it themselves)
  num_processes: int          # -1 = from the environment
  process_id: int             # -1 = from the environment
  cpu_collectives: str        # "gloo" for multi-process CPU runs, "" otherwise


@dataclasses.dataclass(frozen=True)
class Config:
  seed: int
  model: ModelCfg
  task: TaskCfg
  warm_start: WarmStartCfg
  rollout: RolloutCfg
  algo: AlgoCfg
  train: TrainCfg
  optim: OptimCfg
  eval: EvalCfg
  mesh: MeshCfg
  lora: LoraCfg
  checkpoint: CheckpointCfg
  log: LogCfg
  distributed: DistributedCfg

  @property
  def seq_len(self) -> int:
    """Tokens per training row: prompt + generation budget."""
    return self.task.max_prompt_len + self.rollout.max_new_tokens

  @property
  def minibatch_prompts(self) -> int:
    return self.train.batch_size // self.train.num_minibatches

  @property
  def minibatch_seqs(self) -> int:
    """Sequences per optimizer update."""
    return self.minibatch_prompts * self.rollout.group_size

  @property
  def micro_batches(self) -> int:
    """Gradient-accumulation slices per optimizer update (rows of seq_len tokens each)."""
    return self.minibatch_seqs // (self.train.micro_batch_size or self.minibatch_seqs)

  @property
  def prompts_per_round(self) -> int:
    """Prompts sampled per generation round (dynamic sampling over-generates)."""
    return self.algo.gen_batch_size if self.algo.dynamic_sampling else self.train.batch_size

  @property
  def loss_scale_factor(self) -> float:
    """seq-mean-token-sum-norm's divisor: the configured one, else the generation budget (the
    reference's response length; not the row length, which includes the prompt)."""
    factor = self.algo.loss_scale_factor
    return self.rollout.max_new_tokens if factor is None else factor

  @property
  def warmup_updates(self) -> int:
    # The paper counts warm-up in rollout steps; the schedule ticks per optimizer update.
    return self.optim.warmup_steps * self.train.num_minibatches
