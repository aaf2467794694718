"""Sampling with the run's policy: one generation round of groups (sample -> score -> gather
across hosts), and an evaluation of the held-out set. Seeds derive from the run seed and the
loop counters, so any host count and a resumed run draw the same samples."""
import numpy as np

from dapo_jax import eval as eval_lib
from dapo_jax import rewards
from dapo_jax.core import overlong
from dapo_jax.data.pipeline import encode_eval_prompts
from dapo_jax.rewards import reflection
from dapo_jax.train import groups as groups_lib
from dapo_jax.train import multihost, setup
from dapo_jax.train.run import Run


def seed_for(*parts) -> int:
  """A 31-bit seed from the run seed and loop counters (the same on every host and on resume)."""
  return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0] >> 1)


def overlong_cache_len(run: Run) -> int:
  """Eq. 13's L_cache this step: fixed, or from recent lengths (core.overlong's module doc)."""
  algo, max_len = run.cfg.algo, run.cfg.rollout.max_new_tokens
  if not algo.overlong_adaptive:
    return algo.overlong_cache_len
  return overlong.adaptive_cache_len(
      run.loop.length_history, step=run.loop.step, window=algo.overlong_adaptive_window,
      percentile=algo.overlong_adaptive_percentile, max_len=max_len, fallback=algo.overlong_cache_len)


def generate_round(run: Run, round_index: int, num_prompts: int, *, step: int | None = None,
                   between_chunks=None) -> groups_lib.Groups:
  """Round `round_index` of the batch that step `step` (default: this one) trains: the next
  prompts, G samples each, scored; every host's groups gathered in process order (the one-host
  batch). between_chunks: passed to the sampler (a partial rollout's weight sync)."""
  cfg, algo = run.cfg, run.cfg.algo
  step = run.loop.step if step is None else step
  batch = next(run.data)  # this host's contiguous slice of the round's prompts
  pidx, pcount = setup.process_info()
  local = num_prompts // pcount
  if len(batch.prompt_ids) != local:
    raise AssertionError(f"data iterator gave {len(batch.prompt_ids)} prompts, want {local}")
  if run.prefilter is not None:  # drop prompts recorded as all-correct / all-wrong
    batch = run.prefilter.select(batch, step=run.loop.step)
  rollout = cfg.rollout
  samples = run.sampler.sample_groups(
      batch.prompt_ids, group_size=rollout.group_size, max_new_tokens=rollout.max_new_tokens,
      temperature=rollout.temperature, top_p=rollout.top_p, top_k=rollout.top_k,
      seed=seed_for(cfg.seed, 1, step, round_index), eos_ids=run.task.eos_ids,
      prompt_offset=pidx * local,  # global prompt index: same samples on any host count
      between_chunks=between_chunks)
  run.loop.paging.add(multihost.per_process([samples.stats["preemptions"],
                                        samples.stats["pool_peak_frac"]]))
  scored = groups_lib.score_rollout(
      samples, batch.prompt_ids, batch.answers, decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(cfg.task.reward), overlong_penalty=algo.overlong_penalty,
      max_len=rollout.max_new_tokens, cache_len=overlong_cache_len(run),
      factor=algo.overlong_factor)
  out = multihost.gather_groups(scored, max_prompt_len=cfg.task.max_prompt_len)
  if algo.overlong_adaptive:  # every host's lengths, so every host computes the same ramp
    run.loop.length_history = overlong.record_lengths(
        run.loop.length_history, step=run.loop.step, lengths=out.lengths, window=algo.overlong_adaptive_window)
  if run.prefilter is not None:
    run.prefilter.observe(out, step=run.loop.step)
  return out


def batch_extras(run: Run, batch: groups_lib.Groups, errors_before: int,
                 truncated_before: int) -> dict:
  """The kept batch's metrics beyond dynamic sampling's, counted on this process since the
  batch's first round: verifier errors (responses whose parsing raised; scored -1) above
  `errors_before`, prompts cut to task.max_prompt_len above `truncated_before`; the overlong
  ramp's L_cache, the paged KV cache's preemptions and fullest shard (all hosts; reset here),
  reflection phrases, the pre-filter's records."""
  out = {"verifier_errors": rewards.verifier_errors() - errors_before,
         "prompts_truncated": run.data.num_truncated - truncated_before,
         "overlong_cache_len": overlong_cache_len(run)} | run.loop.paging.take()
  out.update(reflection.step_metrics(  # {} unless log.reflection_phrases is set
      batch, spec=run.cfg.log.reflection_phrases, decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(run.cfg.task.reward)))
  if run.prefilter is not None:
    out.update(run.prefilter.step_metrics())
  return out


def run_eval(run: Run, tag: str) -> dict:
  """avg@k / pass@k / maj@k with CIs on the held-out set (eval.*), tagged, with the number of
  prompts cut to task.max_prompt_len."""
  cfg, evaluation = run.cfg, run.cfg.eval
  prompts, cut = encode_eval_prompts(run.task.tokenizer, [x.prompt for x in run.task.eval],
                                     max_prompt_len=cfg.task.max_prompt_len,
                                     use_chat_template=cfg.task.chat_template)
  return eval_lib.evaluate(
      run.sampler, prompts, [x.answer for x in run.task.eval], k=evaluation.num_samples,
      temperature=evaluation.temperature, top_p=evaluation.top_p,
      max_new_tokens=cfg.rollout.max_new_tokens,
      seed=seed_for(cfg.seed, 2, 0), decode=run.task.decode,
      reward_fn=rewards.get_reward_fn(cfg.task.reward), eos_ids=run.task.eos_ids,
      bootstrap_samples=evaluation.bootstrap_samples) | {"tag": tag, "prompts_truncated": cut}
