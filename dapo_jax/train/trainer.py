"""The DAPO loop, top to bottom: `train` runs `rollout_step` until num_steps, then evaluates.

  rollout_step = collect -> prepare -> update -> sync
    collect   prompts -> sample_groups (G each) -> verifier reward + Eq. 13 overlong penalty
              -> dynamic sampling (keep 0 < #correct < G, over-generate in rounds)
    prepare   group advantages of the shaped reward -> [prompt][response] rows (overlong
              filter in the loss mask) -> each mini-batch packed (train.packing) -> old (and
              reference) log-probs on the packed rows (none with one on-policy update a step:
              its own forward gives them)
    update    num_minibatches jitted optimizer updates (token-level (sum, count) loss)
    sync      trainer params -> the sampler's copy
  then: health checks -> log -> eval every k steps -> checkpoint

Every DAPO technique is a config switch, so naive GRPO and each Table-1 rung run this same loop.
"""
import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax import eval as eval_lib
from dapo_jax import metrics as metrics_lib
from dapo_jax import rewards, sharding
from dapo_jax.config import Config
from dapo_jax.core import advantages, loss_modes, overlong
from dapo_jax.data.pipeline import PromptIterator, encode_prompt
from dapo_jax.rewards import reflection
from dapo_jax.rollout import budget
from dapo_jax.train import checkpoint as ckpt_lib, checkpoint_dirs
from dapo_jax.train import dynamic_sampling, groups as groups_lib, multihost, recovery, setup, sft
from dapo_jax.train import levels, logprob_pass, prefilter as prefilter_lib
from dapo_jax.train import state as state_lib
from dapo_jax.train import train_step as train_step_lib
from dapo_jax.train.train_step import train_step


class TooManyBadSteps(RuntimeError):
  """K consecutive rollout steps whose updates were all non-finite (and skipped)."""


def _seed(*parts) -> int:
  """A 31-bit seed from the run seed and loop counters (the same on every host and on resume)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


@dataclasses.dataclass
class Run:
  """The live parts of a run (built once by `build`)."""
  cfg: Config
  workdir: str
  mesh: object
  task: setup.Task
  graphdef: object
  model_config: object
  state: state_lib.TrainState
  optimizer: object
  sampler: object
  data: PromptIterator
  ref_params: object
  step: int = 0
  bad_steps: int = 0
  first_length: float | None = None
  length_history: dict = dataclasses.field(default_factory=dict)  # by step, adaptive L_cache
  prefilter: prefilter_lib.Prefilter | None = None  # algo.prefilter's records


def _build_sampler(cfg: Config, model, mcfg):
  """The sampler owns its copy of the weights, moved device-to-device in its dtype onto its
  own mesh (all chips, replicas x tensor); with several processes each host drives its slice.
  Its slots and pages come from the KV-cache budget (rollout.kv_cache_gib, num_slots)."""
  sampler_mesh = setup.build_sampler_mesh(
      cfg, jax.local_devices() if multihost.is_multi() else None)
  return budget.build_sampler(cfg, model, mcfg, sampler_mesh)


def build(cfg: Config, workdir: str, *, resume: bool, mesh=None) -> Run:
  mesh = setup.build_mesh(cfg) if mesh is None else mesh
  setup.check_batch_fits_mesh(cfg, mesh)
  task = setup.load_task(cfg)
  model, mcfg = setup.build_model(cfg, mesh, task.tokenizer)
  graphdef, params = nnx.split(model)
  seq_len = cfg.seq_len
  has_ckpt = resume and checkpoint_dirs.latest(os.path.join(workdir, "checkpoints")) is not None
  if cfg.warm_start.steps and not has_ckpt:
    params, _ = sft.warm_start(
        graphdef, params, task.train, task.tokenizer, steps=cfg.warm_start.steps,
        batch_size=cfg.warm_start.batch_size, lr=cfg.warm_start.lr, seq_len=seq_len,
        eos_id=task.eos_ids[0], seed=cfg.seed, data_sharding=sharding.data_sharding(mesh),
        use_chat_template=cfg.task.chat_template, demo=setup.demo_fn(cfg))
  optimizer = state_lib.make_optimizer(
      lr=cfg.optim.lr, warmup_updates=cfg.warmup_updates, weight_decay=cfg.optim.weight_decay,
      grad_clip=cfg.optim.grad_clip, b1=cfg.optim.b1, b2=cfg.optim.b2, eps=cfg.optim.eps)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = jax.jit(functools.partial(state_lib.create, optimizer=optimizer),
                  out_shardings=state_lib.shardings(params, optimizer, replicated))(params)
  sampler = _build_sampler(cfg, nnx.merge(graphdef, params), mcfg)
  a = cfg.algo
  pidx, pcount = setup.process_info()
  data = PromptIterator(task.train, task.tokenizer, batch_size=cfg.prompts_per_round,
                        seed=cfg.seed, max_prompt_len=cfg.task.max_prompt_len,
                        shard_index=pidx, num_shards=pcount,
                        use_chat_template=cfg.task.chat_template)
  ref_params = jax.tree.map(jnp.copy, params) if a.kl_coef > 0 else None
  return Run(cfg=cfg, workdir=workdir, mesh=mesh, task=task, graphdef=graphdef,
             model_config=mcfg, state=state, optimizer=optimizer, sampler=sampler, data=data,
             ref_params=ref_params,
             prefilter=prefilter_lib.from_config(a, seed=cfg.seed, num_processes=pcount))


def _overlong_cache_len(run: Run) -> int:
  """Eq. 13's L_cache this step: fixed, or from recent lengths (core.overlong's module doc)."""
  a, max_len = run.cfg.algo, run.cfg.rollout.max_new_tokens
  if not a.overlong_adaptive:
    return a.overlong_cache_len
  return overlong.adaptive_cache_len(
      run.length_history, step=run.step, window=a.overlong_adaptive_window,
      percentile=a.overlong_adaptive_percentile, max_len=max_len, fallback=a.overlong_cache_len)


def _generate_round(run: Run, round_index: int, num_prompts: int) -> groups_lib.Groups:
  cfg, a = run.cfg, run.cfg.algo
  batch = next(run.data)  # this host's contiguous slice of the round's prompts
  pidx, pcount = setup.process_info()
  local = num_prompts // pcount
  if len(batch.prompt_ids) != local:
    raise AssertionError(f"data iterator gave {len(batch.prompt_ids)} prompts, want {local}")
  if run.prefilter is not None:  # drop prompts recorded as all-correct / all-wrong
    batch = run.prefilter.select(batch, step=run.step)
  r = cfg.rollout
  rollout = run.sampler.sample_groups(
      batch.prompt_ids, group_size=r.group_size, max_new_tokens=r.max_new_tokens,
      temperature=r.temperature, top_p=r.top_p, top_k=r.top_k,
      seed=_seed(cfg.seed, 1, run.step, round_index), eos_ids=run.task.eos_ids,
      prompt_offset=pidx * local)  # global prompt index: same samples on any host count
  scored = groups_lib.score_rollout(
      rollout, batch.prompt_ids, batch.answers, decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(cfg.task.reward), overlong_penalty=a.overlong_penalty,
      max_len=r.max_new_tokens, cache_len=_overlong_cache_len(run), factor=a.overlong_factor)
  out = multihost.gather_groups(scored, max_prompt_len=cfg.task.max_prompt_len)
  if a.overlong_adaptive:  # every host's lengths, so every host computes the same ramp
    run.length_history = overlong.record_lengths(
        run.length_history, step=run.step, lengths=out.lengths, window=a.overlong_adaptive_window)
  if run.prefilter is not None:
    run.prefilter.observe(out, step=run.step)
  return out


def _jitted_train_step(run: Run):
  """The update with explicit layouts: the state keeps its (fsdp/tensor) sharding, every
  mini-batch array is split over the batch axes, metrics come back replicated."""
  state_sh = jax.tree.map(lambda x: x.sharding, run.state)
  replicated = jax.sharding.NamedSharding(run.mesh, jax.sharding.PartitionSpec())
  return jax.jit(functools.partial(train_step, graphdef=run.graphdef, optimizer=run.optimizer,
                                   cfg=run.cfg, mesh=run.mesh),
                 in_shardings=(state_sh, sharding.data_sharding(run.mesh)),
                 out_shardings=(state_sh, replicated), donate_argnums=(0,))


@dataclasses.dataclass
class Prepared:
  """A kept batch laid out for the update (host arrays, rows n·G + g)."""
  arrays: dict              # tokens, attn_mask, loss_mask, old_logp, adv[, ref_logp], pack_*: [B, S] / [B]
  resp_mask_BxS: np.ndarray  # response tokens (before overlong filtering)
  adv_NxG: np.ndarray
  logp_BxS: np.ndarray | None  # log-probs under the params that generated the batch (None
  entropy_BxS: np.ndarray | None  # until the update when it computes them: `on_policy_update`)


def on_policy_update(cfg: Config) -> bool:
  """True when the step's one update runs at the sampling params and needs the recomputed old
  log-probs only inside itself (no off-policy weights, no Clip-/KL-Cov selection before it):
  the update's own forward then gives them, detached, with the entropy metric, and prepare
  runs no log-prob pass (TRL's num_iterations = 1; train_step's module doc)."""
  a = cfg.algo
  return (cfg.train.num_minibatches == 1 and a.old_logp_source == "recompute"
          and a.is_correction == "none" and not loss_modes.MODES[a.loss_mode].selects)


def collect(run: Run) -> tuple[groups_lib.Groups, dict]:
  """Sample and score groups; with dynamic sampling keep only mixed ones (DAPO §3.2)."""
  a = run.cfg.algo
  errors_before = rewards.verifier_errors()
  tally = levels.for_run(run.cfg, run.task.decode)  # accuracy per difficulty level
  batch, summary, _ = dynamic_sampling.collect(
      tally.wrap(functools.partial(_generate_round, run)), batch_size=run.cfg.train.batch_size,
      gen_batch_size=a.gen_batch_size, max_gen_rounds=a.max_gen_rounds,
      dynamic=a.dynamic_sampling)
  # Responses whose parsing raised (scored -1); this process's count.
  summary["verifier_errors"] = rewards.verifier_errors() - errors_before
  summary["overlong_cache_len"] = _overlong_cache_len(run)
  summary.update(tally.metrics())
  summary.update(reflection.step_metrics(  # {} unless log.reflection_phrases is set
      batch, spec=run.cfg.log.reflection_phrases, decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(run.cfg.task.reward)))
  if run.prefilter is not None:
    summary.update(run.prefilter.step_metrics())
  return batch, summary


def prepare(run: Run, batch: groups_lib.Groups, *, separate_pass: bool = False) -> Prepared:
  """Group advantages of the shaped reward, the row layout, old (and reference) log-probs
  (left to the update when `on_policy_update(cfg)`, unless `separate_pass`: e.g. to measure a
  base's entropy without updating it)."""
  a = run.cfg.algo
  adv_NxG = np.asarray(advantages.group_advantages(
      jnp.asarray(batch.reward), scale_by_std=a.adv_scale_by_std, eps=a.adv_eps))
  arrays, resp_mask = groups_lib.training_arrays(batch, adv_NxG, seq_len=run.cfg.seq_len,
                                                 overlong_filter=a.overlong_filter)
  arrays.update(logprob_pass.plans(run.cfg, arrays))  # each mini-batch's packed rows
  if on_policy_update(run.cfg) and not separate_pass:
    logp = entropy = None
    del arrays["old_logp"]  # train_step takes them from its own forward
  else:
    logp, entropy = logprob_pass.batched_logprobs(run, run.state.params, arrays,
                                                  with_entropy=True)
  if a.is_correction != "none":  # off-policy correction weighs sampler vs trainer log-probs
    arrays["behav_logp"] = arrays["old_logp"]  # still the sampler's here
  if a.old_logp_source == "recompute" and logp is not None:
    arrays["old_logp"] = logp * resp_mask
  if a.kl_coef > 0:
    arrays["ref_logp"], _ = logprob_pass.batched_logprobs(run, run.ref_params, arrays,
                                                          with_entropy=False)
  return Prepared(arrays=arrays, resp_mask_BxS=resp_mask, adv_NxG=adv_NxG, logp_BxS=logp,
                  entropy_BxS=entropy)


def update(run: Run, step_fn, arrays: dict) -> list[dict]:
  """num_minibatches optimizer updates over consecutive slices of the rows (device metrics)."""
  cfg = run.cfg
  rows = cfg.minibatch_seqs
  dsh = sharding.data_sharding(run.mesh)
  step_metrics = []
  for mb in range(cfg.train.num_minibatches):
    minibatch = multihost.put_tree({k: v[mb * rows:(mb + 1) * rows] for k, v in arrays.items()},
                                   dsh)
    with jax.transfer_guard("disallow"):  # every input is placed explicitly above
      run.state, m = step_fn(run.state, minibatch)
    step_metrics.append(m)
  return step_metrics


def sync(run: Run):
  """Trainer params -> the sampler's copy (resharded to the sampler's layout)."""
  run.sampler.update_params(run.state.params)  # device-to-device, with one process or several


def rollout_step(run: Run, step_fn) -> dict:
  """One rollout step in the paper's order: collect -> prepare -> update -> sync.
  Returns the step's metrics (host floats)."""
  timer = metrics_lib.PhaseTimer()
  with timer("rollout"):
    batch, sampling_summary = collect(run)
  with timer("prepare"):
    prep = prepare(run, batch)
  # Real tokens / positions the update computes (1 = no padding; train.packing raises it).
  sampling_summary["pack_fill"] = logprob_pass.packed_token_share(run.cfg, prep.arrays)
  with timer("update"):
    step_metrics = update(run, step_fn, prep.arrays)
    jax.block_until_ready(run.state)  # timed to completion, not to dispatch
  with timer("sync"):
    sync(run)
  step_metrics = multihost.to_host(step_metrics)  # pulled after the sync is dispatched
  if prep.logp_BxS is None:  # on-policy: the one update's forward gave them
    prep.logp_BxS, prep.entropy_BxS = (step_metrics[0].pop(k) for k in train_step_lib.TOKEN_KEYS)
  skipped = sum(float(m["skipped"]) for m in step_metrics)
  run.bad_steps = run.bad_steps + 1 if skipped == len(step_metrics) else 0
  return metrics_lib.rollout_metrics(batch, prep, step_metrics, sampling_summary, timer)


def run_eval(run: Run, tag: str) -> dict:
  cfg, e = run.cfg, run.cfg.eval
  prompts = [encode_prompt(run.task.tokenizer, x.prompt,
                           use_chat_template=cfg.task.chat_template)[-cfg.task.max_prompt_len:]
             for x in run.task.eval]
  return eval_lib.evaluate(
      run.sampler, prompts, [x.answer for x in run.task.eval], k=e.num_samples,
      temperature=e.temperature, top_p=e.top_p, max_new_tokens=cfg.rollout.max_new_tokens,
      seed=_seed(cfg.seed, 2, 0), decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(cfg.task.reward), eos_ids=run.task.eos_ids,
      bootstrap_samples=e.bootstrap_samples) | {"tag": tag}


def _meta(run: Run) -> dict:
  return {"step": run.step, "data": run.data.state(), "bad_steps": run.bad_steps,
          "first_length": run.first_length, "seed": run.cfg.seed,
          "prefilter": run.prefilter.state() if run.prefilter is not None else None,
          "length_history": overlong.history_state(run.length_history),
          "config": json.loads(json.dumps(dataclasses.asdict(run.cfg)))}


def _log_step(run: Run, m: dict, writer, health):
  """Health warnings, the step's record, the stop after too many skipped steps, periodic eval."""
  cfg = run.cfg
  m["warnings"] = health.check(run.step, m)
  run.first_length = health.first_length
  writer.write(run.step, m)
  if run.bad_steps >= cfg.train.max_bad_steps:
    raise TooManyBadSteps(f"{run.bad_steps} consecutive steps with non-finite loss or "
                          f"gradients (every update skipped); stopping at step {run.step}")
  if cfg.eval.every_steps and run.step % cfg.eval.every_steps == 0 \
      and run.step < cfg.train.num_steps:
    writer.write(run.step, run_eval(run, f"step{run.step}"), kind="eval")


def train(run: Run, *, resume: bool) -> dict:
  """The loop. Returns {"before": eval, "after": eval, "steps": n}. After a SIGTERM it stops at
  the next step boundary, saves, and returns {"before": eval, "steps": n, "preempted": True}."""
  cfg = run.cfg
  ckpt = ckpt_lib.Checkpointer(os.path.join(run.workdir, "checkpoints"), keep=cfg.checkpoint.keep,
                               async_save=cfg.checkpoint.async_save)
  results, keep = recovery.start(run, ckpt, resume=resume)
  writer, health = metrics_lib.loggers(cfg, run.workdir, keep_records=keep,
                                        first_length=run.first_length)
  if "before" not in results:
    results["before"] = run_eval(run, "before")
    writer.write(0, results["before"], kind="eval")
  step_fn = _jitted_train_step(run)
  # The metadata carries the results so far and the log position, so a resume keeps "before"
  # and cuts metrics.jsonl back to this checkpoint.
  save = lambda: ckpt.save(run.step, run.state, _meta(run) | {  # noqa: E731
      "results": dict(results), "metrics_records": writer.records})
  notice = recovery.Notice()
  try:
    while run.step < cfg.train.num_steps and not notice.stop_now():
      ckpt.poll()  # a failed background save stops the run here, not at the next save
      m = rollout_step(run, step_fn)
      run.step += 1
      _log_step(run, m, writer, health)
      if cfg.checkpoint.every_steps and run.step % cfg.checkpoint.every_steps == 0:
        save()
  finally:
    notice.close()
  if ckpt.latest_step() != run.step:
    save()
  ckpt.close()
  if run.step < cfg.train.num_steps:  # stopped by SIGTERM, with this step saved
    writer.close()
    return results | {"steps": run.step, "preempted": True}
  results["after"] = run_eval(run, "after")
  writer.write(run.step, results["after"], kind="eval")
  writer.close()
  results["steps"] = run.step
  return results
