"""The DAPO loop, top to bottom: `train` runs `rollout_step` until num_steps, then evaluates.

  rollout_step = collect -> prepare -> update -> sync          (rollout.max_staleness = 0)
    collect   (train/collector.py) prompts -> sample_groups (G each) -> verifier reward + Eq. 13 overlong penalty
              -> dynamic sampling (keep 0 < #correct < G, over-generate in rounds)
    prepare   group advantages of the shaped reward -> [prompt][response] rows (overlong
              filter in the loss mask) -> each mini-batch packed (train.packing) -> old (and
              reference) log-probs on the packed rows (none with one on-policy update a step:
              its own forward gives them)
    update    num_minibatches jitted optimizer updates (token-level (sum, count) loss)
    sync      trainer params -> the sampler's copy
  pipelined_step = take -> prepare -> update || collect ahead -> sync   (max_staleness >= 1)
    take      this step's batch, collected while earlier updates ran (train/pipeline.py)
    update || collect ahead   the update is dispatched; the sampler collects the next
              batches while it runs, within the staleness bound, syncing its weights when it ends
  then: health checks -> log -> eval every k steps -> checkpoint

Every DAPO technique is a config switch, so naive GRPO and each Table-1 rung run this same loop.
"""
import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax import metrics as metrics_lib
from dapo_jax import sharding
from dapo_jax.core import advantages, overlong
from dapo_jax.train import checkpoint as ckpt_lib
from dapo_jax.train import collector as collector_lib
from dapo_jax.train import groups as groups_lib, logprob_pass, multihost
from dapo_jax.train import pipeline as pipeline_lib
from dapo_jax.train import placement, recovery, rounds
from dapo_jax.train.run import (  # noqa: F401  (the loop's entry points)
    Run, build, jitted_update, policy_params)
from dapo_jax.train.batch import MiniBatch, on_policy_update


class TooManyBadSteps(RuntimeError):
  """K consecutive rollout steps whose updates were all non-finite (and skipped)."""


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A kept batch laid out for the update: every mini-batch's rows (host arrays, rows n·G + g)."""
  batch: MiniBatch
  resp_mask_BxS: np.ndarray  # response tokens (before overlong filtering)
  adv_NxG: np.ndarray
  behav_logp_BxS: np.ndarray  # the sampler's log-probs (the batch keeps them only when the
                              # off-policy correction needs them)
  logp_BxS: np.ndarray | None  # log-probs under the params the step trains (None until an
  entropy_BxS: np.ndarray | None  # on-policy update computes them)


def prepare(run: Run, batch: groups_lib.Groups, *, separate_pass: bool = False) -> Prepared:
  """Group advantages of the shaped reward, the row layout and packing plans, old (and
  reference) log-probs. With `batch.on_policy_update(cfg)` the old log-probs are left to
  the update's own forward, unless `separate_pass` (e.g. to measure a base's entropy without
  updating it)."""
  cfg, algo = run.cfg, run.cfg.algo
  adv_NxG = np.asarray(advantages.group_advantages(
      jnp.asarray(batch.reward), scale_by_std=algo.adv_scale_by_std, eps=algo.adv_eps))
  rows, resp_mask = groups_lib.training_batch(batch, adv_NxG, seq_len=cfg.seq_len,
                                              overlong_filter=algo.overlong_filter)
  rows = logprob_pass.with_plans(cfg, rows)
  logp = entropy = None
  if separate_pass or not on_policy_update(cfg):
    logp, entropy = logprob_pass.batched_logprobs(run, policy_params(run), rows,
                                                  with_entropy=True)
  if algo.old_logp_source == "sampler":
    old = rows.behav_logp_BxS
  else:  # recomputed by the trainer (none yet: the on-policy update's forward gives them)
    old = None if logp is None else logp * resp_mask
  ref = None
  if algo.kl_coef > 0:
    ref, _ = logprob_pass.batched_logprobs(run, policy_params(run, run.model.ref_params), rows,
                                           with_entropy=False)
  behav = rows.behav_logp_BxS
  rows = dataclasses.replace(rows, old_logp_BxS=old, ref_logp_BxS=ref,
                             behav_logp_BxS=behav if algo.corrects_off_policy() else None)
  return Prepared(batch=rows, resp_mask_BxS=resp_mask, adv_NxG=adv_NxG, behav_logp_BxS=behav,
                  logp_BxS=logp, entropy_BxS=entropy)


def update(run: Run, step_fn, batch: MiniBatch) -> tuple[list[dict], list]:
  """num_minibatches optimizer updates over consecutive slices of the rows: (device metrics,
  the on-policy forward's TokenStats or None) per update."""
  cfg = run.cfg
  rows = cfg.minibatch_seqs
  dsh = sharding.data_sharding(run.mesh)
  step_metrics, tokens = [], []
  for mb in range(cfg.train.num_minibatches):
    minibatch = multihost.put_tree(batch.rows(mb * rows, (mb + 1) * rows), dsh)
    with jax.transfer_guard("disallow"):  # every input is placed explicitly above
      run.loop.state, m, t = step_fn(run.loop.state, minibatch)
    step_metrics.append(m)
    tokens.append(t)
  return step_metrics, tokens


def sync(run: Run):
  """Trainer params -> the sampler's copy (resharded to the sampler's layout), as the policy
  version the update made (the steps done, this one included)."""
  run.sampler.update_params(run.loop.state.params, version=run.loop.step + 1)  # device to device


def rollout_step(run: Run, step_fn) -> dict:
  """One rollout step in the paper's order: collect -> prepare -> update -> sync.
  Returns the step's metrics (host floats)."""
  timer = metrics_lib.PhaseTimer()
  with timer("rollout"):
    batch, sampling_summary = collector_lib.collect(run)
  if placement.frees_sampler_weights(run.cfg):  # dead until the sync refills them
    run.sampler.engine.release_params()
  with timer("prepare"):
    prep = prepare(run, batch)
  # Real tokens / positions the update computes (1 = no padding; train.packing raises it).
  sampling_summary["pack_fill"] = logprob_pass.packed_token_share(run.cfg, prep.batch)
  with timer("update"):
    step_metrics, tokens = update(run, step_fn, prep.batch)
    jax.block_until_ready(run.loop.state)  # timed to completion, not to dispatch
  with timer("sync"):
    sync(run)
  return _finish(run, batch, prep, step_metrics, tokens, sampling_summary, timer)


def pipelined_step(run: Run, step_fn, pipe: pipeline_lib.Pipeline) -> dict:
  """One step of the asynchronous loop (train/pipeline.py): take this step's batch (collected
  while earlier updates ran, or now), prepare it, dispatch its update and, while the update
  runs, collect the next batches; then wait for the update and sync its weights.
  Returns the step's metrics (host floats)."""
  timer = metrics_lib.PhaseTimer()
  collected = pipe.take(run)
  with timer("prepare"):
    prep = prepare(run, collected.groups)
  summary = dict(collected.summary, pack_fill=logprob_pass.packed_token_share(run.cfg,
                                                                              prep.batch))
  t_update = time.perf_counter()
  step_metrics, tokens = update(run, step_fn, prep.batch)  # dispatched, not waited for
  pipe.collect_ahead(run, version=run.loop.step + 1)
  timer.add("update", pipe.finish_update(run) - t_update)
  for name, seconds in pipe.step_times().items():
    timer.add(name.removeprefix("time_").removesuffix("_s"), seconds)
  step_metrics, tokens = multihost.to_host((step_metrics, tokens))
  return _finish(run, collected.groups, prep, step_metrics, tokens, summary, timer)


def _finish(run: Run, batch, prep: Prepared, step_metrics, tokens, summary, timer) -> dict:
  """The step's record from host values; counts steps whose every update was skipped."""
  if prep.logp_BxS is None:  # on-policy: the one update's forward gave them
    prep = dataclasses.replace(prep, logp_BxS=tokens[0].logp_BxS,
                               entropy_BxS=tokens[0].entropy_BxS)
  if run.model.frozen is not None:  # LoRA: what a weight sync moves (the adapters alone)
    summary = dict(summary, weight_sync_bytes=run.sampler.engine.sync_bytes())
  skipped = sum(float(m["skipped"]) for m in step_metrics)
  run.loop.bad_steps = run.loop.bad_steps + 1 if skipped == len(step_metrics) else 0
  return metrics_lib.rollout_metrics(batch, prep, step_metrics, summary, timer,
                                     version=run.loop.step, is_cap=run.cfg.algo.is_cap)


def _meta(run: Run, pipe: pipeline_lib.Pipeline | None) -> dict:
  data = pipe.resume_data_state(run) if pipe else run.data.state()
  return {"step": run.loop.step, "data": data, "bad_steps": run.loop.bad_steps,
          "first_length": run.loop.first_length, "seed": run.cfg.seed,
          "prefilter": run.prefilter.state() if run.prefilter is not None else None,
          "length_history": overlong.history_state(run.loop.length_history),
          "lora_base": dataclasses.asdict(run.model.base) if run.model.base else None,
          "config": json.loads(json.dumps(dataclasses.asdict(run.cfg)))}


def _log_step(run: Run, m: dict, writer, health):
  """Health warnings, the step's record, the stop after too many skipped steps, periodic eval."""
  cfg = run.cfg
  m["warnings"] = health.check(run.loop.step, m)
  run.loop.first_length = health.first_length
  writer.write(run.loop.step, m)
  if run.loop.bad_steps >= cfg.train.max_bad_steps:
    raise TooManyBadSteps(f"{run.loop.bad_steps} consecutive steps with non-finite loss or "
                          f"gradients (every update skipped); stopping at step {run.loop.step}")
  if cfg.eval.every_steps and run.loop.step % cfg.eval.every_steps == 0 \
      and run.loop.step < cfg.train.num_steps:
    writer.write(run.loop.step, rounds.run_eval(run, f"step{run.loop.step}"), kind="eval")


def _loop_step(run: Run, pipelined: bool | None):
  """(the loop's Pipeline or None, its step function: pipelined_step on it, or rollout_step)."""
  if run.cfg.rollout.max_staleness if pipelined is None else pipelined:
    pipe = pipeline_lib.Pipeline(run)  # from the restored step: the batches ahead start there
    return pipe, functools.partial(pipelined_step, pipe=pipe)
  return None, rollout_step


def train(run: Run, *, resume: bool, pipelined: bool | None = None) -> dict:
  """The loop. Returns {"before": eval, "after": eval, "steps": n}. After a stop signal
  (SIGTERM, SIGINT, SIGHUP) it stops at the next step boundary, saves, and returns
  {"before": eval, "steps": n, "preempted": True, "signal": its name}. pipelined: the
  asynchronous loop (a Pipeline, local to this call) or not; None = rollout.max_staleness >= 1."""
  cfg = run.cfg
  ckpt = ckpt_lib.Checkpointer(os.path.join(run.workdir, "checkpoints"), keep=cfg.checkpoint.keep,
                               async_save=cfg.checkpoint.async_save)
  results, keep = recovery.start(run, ckpt, resume=resume)
  writer, health = metrics_lib.loggers(cfg, run.workdir, keep_records=keep,
                                        first_length=run.loop.first_length)
  if "before" not in results:
    results["before"] = rounds.run_eval(run, "before")
    writer.write(0, results["before"], kind="eval")
  step_fn = jitted_update(run)
  # The metadata carries the results so far and the log position, so a resume keeps "before"
  # and cuts metrics.jsonl back to this checkpoint.
  pipe, step = _loop_step(run, pipelined)
  save = lambda: ckpt.save(run.loop.step, run.loop.state, _meta(run, pipe) | {  # noqa: E731
      "results": dict(results), "metrics_records": writer.records})
  notice = recovery.Notice()
  try:
    while run.loop.step < cfg.train.num_steps and not notice.stop_now():
      ckpt.poll()  # a failed background save stops the run here, not at the next save
      m = step(run, step_fn)
      run.loop.step += 1
      _log_step(run, m, writer, health)
      if cfg.checkpoint.every_steps and run.loop.step % cfg.checkpoint.every_steps == 0:
        save()
  finally:
    notice.close()
  if ckpt.latest_step() != run.loop.step:
    save()
  ckpt.close()
  if run.loop.step < cfg.train.num_steps:  # stopped by a signal, with this step saved
    writer.close()
    return results | {"steps": run.loop.step, "preempted": True,
                      "signal": notice.received}  # None: another process got it
  results["after"] = rounds.run_eval(run, "after")
  writer.write(run.loop.step, results["after"], kind="eval")
  writer.close()
  results["steps"] = run.loop.step
  return results
