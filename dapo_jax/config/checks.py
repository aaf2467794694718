"""Range and cross-field checks of a parsed `dapo_jax.config.Config`, one helper per section.

Every message names the field (`config.section.field: ...`). `config.parse` runs `validate`
before anything imports a model or starts JAX's backends.
"""
import dataclasses

from dapo_jax.config.lora_checks import validate_lora
from dapo_jax.config.sections import (ARCH_FIELDS, AlgoCfg, Config, EvalCfg, LogCfg, ModelCfg,
                                      OptimCfg, RolloutCfg, TaskCfg, WarmStartCfg)
from dapo_jax.core import losses as core_losses
from dapo_jax.core import offpolicy as core_offpolicy
from dapo_jax.core import stats as core_stats
from dapo_jax.data.synthetic import MAX_DIFFICULTY
from dapo_jax.data.testbed import DEMO_KNOBS
# models/quant.WEIGHT_DTYPES (not imported: a config error must not wait for flax; a test
# holds the two equal)
SAMPLER_WEIGHT_DTYPES = ("auto", "bfloat16", "float32", "int8")
# model.attention_impl values that run context-parallel (models/attention.py: CONTEXT_IMPLS).
CONTEXT_ATTENTION_IMPLS = ("auto", "blocked", "splash")


def _require(ok: bool, where: str, msg: str):
  if not ok:
    raise ValueError(f"config.{where}: {msg}")


def validate(c):
  """Ranges and cross-field constraints, one helper per section; every message names the field.
  Runs before anything imports a model or starts JAX's backends."""
  _require(c.seed >= 0, "seed", f"must be >= 0, got {c.seed}")
  _validate_model(c.model)
  _validate_experts(c.model, c.algo)
  _validate_task(c.task, c.warm_start)
  _validate_rollout(c.rollout)
  _require(c.rollout.weight_dtype in SAMPLER_WEIGHT_DTYPES, "rollout.weight_dtype",
           f"must be one of {SAMPLER_WEIGHT_DTYPES}, got {c.rollout.weight_dtype!r}")
  _require(c.rollout.weight_dtype != "int8" or not c.model.num_experts, "rollout.weight_dtype",
           "'int8' quantises the dense projections only; a MoE model (model.num_experts > 0) "
           "keeps 'auto' or 'bfloat16'")
  _validate_async(c.rollout, c.algo)
  _validate_algo(c.algo, c.rollout)
  _validate_loss(c.algo)
  _validate_train(c)
  _validate_optim_eval(c.optim, c.eval)
  _validate_infra(c)


def _positive(section, obj, *fields, allow_zero=False):
  for f in fields:
    v = getattr(obj, f)
    ok = v >= 0 if allow_zero else v > 0
    _require(ok, f"{section}.{f}", f"must be {'>=' if allow_zero else '>'} 0, got {v}")


def _validate_model(m: "ModelCfg"):
  _require(m.source in ("config", "hf"), "model.source", f"must be 'config' or 'hf', got {m.source!r}")
  _require(m.source != "hf" or bool(m.hf_path), "model.hf_path", "required when model.source='hf'")
  if m.source == "config":
    _positive("model", m, "hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim", "rope_theta")
    _require(m.num_heads % m.num_kv_heads == 0, "model.num_kv_heads",
             f"{m.num_kv_heads} must divide num_heads {m.num_heads}")
  _require(m.vocab_size >= 0, "model.vocab_size", "must be >= 0 (0 = from tokenizer)")
  for f in ("dtype", "param_dtype"):
    _require(getattr(m, f) in ("float32", "bfloat16"), f"model.{f}",
             f"must be float32 or bfloat16, got {getattr(m, f)!r}")
  _positive("model", m, "logits_chunk")


def _validate_experts(m: "ModelCfg", a: "AlgoCfg"):
  _require(m.moe_impl in ("grouped", "dense"), "model.moe_impl",
           f"must be 'grouped' or 'dense', got {m.moe_impl!r}")
  _positive("model", m, "num_experts", allow_zero=True)
  if m.source == "config" and m.num_experts:
    _positive("model", m, "num_experts_per_tok", "moe_intermediate_size")
    _require(m.num_experts_per_tok <= m.num_experts, "model.num_experts_per_tok",
             f"{m.num_experts_per_tok} experts per token exceed num_experts {m.num_experts}")
  _require(not (m.routing_replay and m.source == "config" and not m.num_experts),
           "model.routing_replay", "needs a mixture-of-experts model (num_experts > 0)")
  _positive("algo", a, "router_aux_coef", allow_zero=True)
  # An HF checkpoint's experts are known at load; the loss refuses a dense one there.
  _require(not (a.router_aux_coef and m.source == "config" and not m.num_experts),
           "algo.router_aux_coef", "needs a mixture-of-experts model (num_experts > 0)")


def _validate_task(t: "TaskCfg", w: "WarmStartCfg"):
  _require(t.name in ("synthetic", "arith_nl", "dapo_math_17k"), "task.name",
           f"unknown task {t.name!r}")
  _positive("task", t, "max_prompt_len", "difficulty", "num_train")
  _positive("task", t, "shots", allow_zero=True)
  _require(t.shots == 0 or t.name == "arith_nl", "task.shots",
           f"only the arith_nl task shows worked examples; got {t.shots} for {t.name!r}")
  _require(t.difficulty_max == 0 or t.name == "synthetic", "task.difficulty_max",
           f"only the synthetic task mixes difficulties; got {t.difficulty_max} for {t.name!r}")
  _require(t.difficulty_max == 0 or t.difficulty <= t.difficulty_max <= MAX_DIFFICULTY,
           "task.difficulty_max", f"must be 0 or in [difficulty={t.difficulty}, "
           f"{MAX_DIFFICULTY}], got {t.difficulty_max}")
  _positive("warm_start", w, "steps", allow_zero=True)
  _positive("warm_start", w, "batch_size", "lr")
  for k in DEMO_KNOBS:
    _require(0.0 <= getattr(w, k) <= 1.0, f"warm_start.{k}",
             f"must be a probability in [0, 1], got {getattr(w, k)}")
  demos = any(getattr(w, k) for k in DEMO_KNOBS)
  _require(not demos or t.name == "synthetic", "warm_start",
           f"demonstrations ({', '.join(DEMO_KNOBS)}) are written for the synthetic task only, "
           f"got task {t.name!r}")


def _validate_rollout(r: "RolloutCfg"):
  _require(r.group_size >= 2, "rollout.group_size", f"G must be >= 2 for group advantages, got {r.group_size}")
  _positive("rollout", r, "max_new_tokens", "temperature")
  _require(0 < r.top_p <= 1, "rollout.top_p", f"must be in (0, 1], got {r.top_p}")
  _require(r.top_k >= 0, "rollout.top_k", "must be >= 0")
  _require(r.num_slots >= r.group_size, "rollout.num_slots",
           f"{r.num_slots} slots cannot hold one group of G={r.group_size}")
  _require(r.kv_cache_gib >= 0, "rollout.kv_cache_gib", "must be >= 0 GiB (0 = num_slots)")
  _positive("rollout", r, "page_size", "steps_per_call")


PLACEMENTS = ("colocated", "split")


def _validate_async(r: "RolloutCfg", a: "AlgoCfg"):
  """Asynchronous rollout (train/pipeline.py): settings that cannot work, refused before any
  compile (the device counts of a split are checked where the devices are known)."""
  _require(r.max_staleness >= 0, "rollout.max_staleness",
           f"must be >= 0 policy versions (0 = synchronous), got {r.max_staleness}")
  _require(r.placement in PLACEMENTS, "rollout.placement",
           f"must be one of {PLACEMENTS}, got {r.placement!r}")
  split = r.placement == "split"
  count_or_fraction = 0 < r.sampler_devices < 1 or (r.sampler_devices >= 1
                                                    and float(r.sampler_devices).is_integer())
  _require(not split or count_or_fraction, "rollout.sampler_devices",
           f"with placement='split' must be a device count >= 1 or a fraction in (0, 1), got "
           f"{r.sampler_devices}")
  _require(split or r.sampler_devices == 0, "rollout.sampler_devices",
           f"is only used with rollout.placement='split' (got {r.sampler_devices} with "
           f"{r.placement!r}); leave it 0")
  _require(not r.partial or r.max_staleness >= 1, "rollout.partial",
           "needs rollout.max_staleness >= 1 (the synchronous loop never syncs mid-rollout)")
  _require(not r.partial or a.corrects_off_policy() or a.old_logp_source == "sampler",
           "rollout.partial",
           "needs the behaviour log-probs in the loss: algo.is_correction (tis_* or mask_*), "
           "algo.rollout_is / rollout_rs, or "
           "algo.old_logp_source='sampler'; a partial sequence's tokens come from several "
           "policy versions")
  for field in ("prefilter", "overlong_adaptive"):
    _require(r.max_staleness == 0 or not getattr(a, field), f"algo.{field}",
             "is not supported with rollout.max_staleness >= 1 (its records would run ahead "
             "of the trained steps)")


def _validate_algo(a: "AlgoCfg", r: "RolloutCfg"):
  _require(0 <= a.overlong_cache_len <= r.max_new_tokens, "algo.overlong_cache_len",
           f"must be in [0, rollout.max_new_tokens={r.max_new_tokens}], got {a.overlong_cache_len}")
  _positive("algo", a, "overlong_factor", "adv_eps", "kl_coef", "entropy_coef", allow_zero=True)
  _positive("algo", a, "gen_batch_size", "max_gen_rounds")
  _require(0 <= a.overlong_adaptive_percentile <= 100, "algo.overlong_adaptive_percentile",
           f"must be in [0, 100], got {a.overlong_adaptive_percentile}")
  _require(a.overlong_adaptive_window >= 1, "algo.overlong_adaptive_window",
           f"must be >= 1, got {a.overlong_adaptive_window}")
  _require(a.prefilter_min_seen >= 1, "algo.prefilter_min_seen",
           f"must be >= 1, got {a.prefilter_min_seen}")
  _require(0 < a.prefilter_decay <= 1, "algo.prefilter_decay",
           f"must be in (0, 1], got {a.prefilter_decay}")
  _require(0 <= a.prefilter_margin < 0.5, "algo.prefilter_margin",
           f"must be in [0, 0.5), got {a.prefilter_margin}")
  _require(0 <= a.prefilter_revisit <= 1, "algo.prefilter_revisit",
           f"must be in [0, 1], got {a.prefilter_revisit}")
  _require(not a.prefilter or a.dynamic_sampling, "algo.prefilter",
           "needs algo.dynamic_sampling (a round can shrink, a fixed batch cannot)")
  _require(a.kl_kind in core_stats.KL_KINDS, "algo.kl_kind", f"must be one of {core_stats.KL_KINDS}")
  _require(a.old_logp_source in ("recompute", "sampler"), "algo.old_logp_source",
           "must be 'recompute' or 'sampler'")
  # The sampler's log-probs are of the truncated (top-p / top-k) distribution it sampled from,
  # not of the policy the loss differentiates: using them as log π_old would bias every ratio.
  _require(a.old_logp_source != "sampler" or (r.top_p == 1 and r.top_k == 0),
           "algo.old_logp_source", f"'sampler' needs rollout.top_p = 1 and rollout.top_k = 0 "
           f"(got top_p={r.top_p}, top_k={r.top_k}); use 'recompute'")
  _require(a.old_logp_source != "sampler" or not a.corrects_off_policy(), "algo.is_correction",
           "needs algo.old_logp_source='recompute' (with 'sampler' old and behaviour log-probs "
           "are the same arrays: nothing to correct)")


def _validate_loss(a: "AlgoCfg"):
  """The loss knobs, through the checks of core.losses / core.offpolicy (one range per knob)."""
  _require(a.clip_c == 0 or a.clip_c > 1, "algo.clip_c", f"must be 0 (off) or > 1, got {a.clip_c}")
  _require(a.loss_mode in core_losses.MODES, "algo.loss_mode",
           f"unknown loss mode {a.loss_mode!r}; expected one of {tuple(core_losses.MODES)}")
  field = {"agg": "loss_agg", "mode": "loss_mode",
           **{k: f"mode_params.{mode}.{k}"
              for mode, knobs in core_losses.loss_modes.MODE_KNOBS.items() for k in knobs}}
  try:
    for mode in core_losses.MODES:  # every knob, also those of modes not in use
      params = dataclasses.replace(a, loss_mode=mode).loss_params()
      core_losses.check_loss_params(mode, {k: v for k, v in params.items() if v is not None})
    core_losses.resolve_params(a.loss_mode, a.loss_params())
    core_losses.check_agg(a.loss_agg, a.loss_scale_factor, a.loss_mode)
    core_offpolicy.check_is_args(a.is_correction, a.is_cap)
    _check_rollout_correction(a)
  except ValueError as err:
    name, msg = str(err).split(":", 1)
    raise ValueError(f"config.algo.{field.get(name, name)}:{msg}") from None


def _validate_train(c: "Config"):
  train, algo = c.train, c.algo
  _positive("train", train, "num_steps", allow_zero=True)
  _positive("train", train, "batch_size", "max_bad_steps", "length_growth_warn")
  _require(train.num_minibatches > 0 and train.batch_size % train.num_minibatches == 0,
           "train.num_minibatches",
           f"batch_size {train.batch_size} prompts must divide into {train.num_minibatches} "
           "mini-batches")
  seqs = c.minibatch_seqs
  mbs = train.micro_batch_size
  _require(mbs is None or (mbs > 0 and seqs % mbs == 0), "train.micro_batch_size",
           f"must be None or divide the mini-batch of {seqs} sequences, got {mbs}")
  _require(0 <= train.entropy_floor < train.entropy_ceiling, "train.entropy_ceiling",
           f"need 0 <= entropy_floor ({train.entropy_floor}) < entropy_ceiling "
           f"({train.entropy_ceiling})")
  budget = algo.gen_batch_size * algo.max_gen_rounds
  _require(not algo.dynamic_sampling or budget >= train.batch_size, "algo.max_gen_rounds",
           f"algo.gen_batch_size x max_gen_rounds = {budget} prompts can never fill a batch of "
           f"train.batch_size={train.batch_size} groups")


def _validate_optim_eval(o: "OptimCfg", e: "EvalCfg"):
  _positive("optim", o, "lr", "eps")
  _positive("optim", o, "warmup_steps", "weight_decay", "grad_clip", allow_zero=True)
  for f in ("b1", "b2"):
    _require(0 <= getattr(o, f) < 1, f"optim.{f}", f"must be in [0, 1), got {getattr(o, f)}")
  _positive("eval", e, "num_samples", "temperature")
  _require(0 < e.top_p <= 1, "eval.top_p", f"must be in (0, 1], got {e.top_p}")
  _positive("eval", e, "every_steps", "num_problems", "bootstrap_samples", allow_zero=True)


def _validate_infra(c: "Config"):
  for f in ("data", "fsdp", "tensor"):
    v = getattr(c.mesh, f)
    _require(v == -1 or v >= 1, f"mesh.{f}", f"must be -1 or >= 1, got {v}")
  _require([c.mesh.data, c.mesh.fsdp, c.mesh.tensor].count(-1) <= 1, "mesh",
           "at most one axis may be -1")
  _validate_context(c)
  validate_lora(c)
  _positive("checkpoint", c.checkpoint, "keep")
  _validate_log(c.log)
  _positive("checkpoint", c.checkpoint, "every_steps", allow_zero=True)
  procs, pid = c.distributed.num_processes, c.distributed.process_id
  _require(procs == -1 or procs >= 1, "distributed.num_processes",
           f"must be -1 (from the environment) or >= 1, got {procs}")
  _require(pid == -1 or (pid >= 0 and (procs == -1 or pid < procs)), "distributed.process_id",
           f"must be -1 or in [0, num_processes={procs}), got {pid}")


def _validate_context(c: "Config"):
  n = c.mesh.context
  _require(isinstance(n, int) and n >= 1, "mesh.context", f"must be an int >= 1, got {n!r}")
  if n == 1:
    return
  _require(c.seq_len % n == 0, "mesh.context",
           f"{n} must divide the rows' length seq_len={c.seq_len} (prompt + response tokens)")
  _require(c.model.attention_impl in CONTEXT_ATTENTION_IMPLS, "mesh.context",
           f"context parallelism runs the blocked or splash attention, not "
           f"model.attention_impl={c.model.attention_impl!r}")


def _validate_log(g: "LogCfg"):
  phrases = g.reflection_phrases.split(",") if g.reflection_phrases.strip() else []
  _require(all(p.strip() for p in phrases), "log.reflection_phrases",
           f"empty phrase in {g.reflection_phrases!r} (stray comma?)")
  if g.wandb:  # wandb is optional: refused here, before anything compiles, not at the first log
    _require(bool(g.wandb_project), "log.wandb_project", "must name a project when log.wandb")
    try:
      import wandb  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    except ImportError as e:
      raise ValueError(f"config.log.wandb: True, but wandb does not import ({e}); pip install "
                       f"wandb (requirements-dev.txt pins it), or set log.wandb=False") from None


def check_overrides(c: "Config", overrides):
  """Refuses command-line settings the run would ignore: with model.source='hf' the architecture
  is the checkpoint's config.json, so `--config.model.num_layers=4` would silently change
  nothing. `overrides`: the dotted fields set on the command line (vocab_size is compared with
  the checkpoint's when the model is built, so it is not silent)."""
  if c.model.source != "hf":
    return
  for field in sorted(overrides):
    section, _, name = field.partition(".")
    _require(section != "model" or name not in ARCH_FIELDS or name == "vocab_size",
             f"model.{name}", f"set on the command line, but model.source='hf' takes the "
             f"architecture from the checkpoint ({c.model.hf_path}); drop the setting, or use "
             f"model.source='config' for a fresh model of this shape")


def _check_rollout_correction(a: "AlgoCfg"):
  """verl's family: known level and options, thresholds that parse (core.offpolicy's errors,
  renamed to the config field), and not together with is_correction."""
  if "none" not in (a.is_correction, a.rollout_is) or (a.is_correction != "none"
                                                       and a.rollout_rs != "none"):
    raise ValueError(f"rollout_is: algo.is_correction={a.is_correction!r} and "
                     f"rollout_is={a.rollout_is!r} / rollout_rs={a.rollout_rs!r} are two "
                     f"corrections of the same tokens; set one (the other 'none')")
  if a.rollout_is not in ("none", *core_offpolicy.IS_LEVELS):
    raise ValueError(f"rollout_is: {a.rollout_is!r}; expected one of "
                     f"{('none', *core_offpolicy.IS_LEVELS)}")
  for field, parse in (("rollout_is_threshold", lambda: core_offpolicy.parse_is_threshold(
      a.rollout_is_threshold)), ("rollout_rs_threshold", lambda: core_offpolicy.parse_rs(
          a.rollout_rs, a.rollout_rs_threshold))):
    if getattr(a, field.rsplit("_", 1)[0]) == "none":
      continue
    try:
      parse()
    except ValueError as err:
      where = "rollout_rs" if str(err).startswith("rejection_mask: options") else field
      raise ValueError(f"{where}: {str(err).split(': ', 1)[1]}") from None
