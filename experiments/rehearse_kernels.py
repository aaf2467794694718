"""Stage 3 of experiments/rehearse_pod.py: the TPU kernels executed (Pallas TPU interpret mode)
on the rehearsal's model, against the reference path on the same tokens. Runs in a process with
8 forced CPU devices (rehearse_pod.py starts it); the kernels' meshes take 4 of them."""
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.experimental.pallas import tpu as pltpu

from configs import pod_rehearsal_cpu
from dapo_jax import config as config_lib, metrics, sharding
from dapo_jax.data import pipeline
from dapo_jax.models import attention
from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler
from dapo_jax.train import groups as groups_lib, logprob_pass, objective, placement, setup

# Why these: experiments/rehearse_pod.py's docstring.
TOL = {"kernel_logp": 1e-4, "logp": 0.25, "loss_rel": 0.05, "paged_logp": 0.25}
CONTEXT = 2  # the context-parallel scoring's mesh: context 2 x tensor 2


def _variant(cfg, **model):
  return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model))


def prompts_of(cfg, task, n):
  """The task's first n training prompts as token ids (in the chat template when the config
  says so), left-truncated as the loop does (here: DAPO-Math-17k's)."""
  chat = cfg.task.chat_template
  return [pipeline.encode_prompt(task.tokenizer, ex.prompt, use_chat_template=chat)
          [-cfg.task.max_prompt_len:] for ex in task.train[:n]]


def _sample(model, cfg, mesh, prompts, task, impl):
  """One rollout by the paged engine on `mesh` with the given decode attention, its pool two
  full-length rows per batch shard (plus the null page), fewer than the rows: rows wait for
  pages, and are preempted when a shard runs out (`paged_preemptions` counts them; rows grow
  rollout.steps_per_call tokens a call, as in the loop)."""
  r = cfg.rollout
  pages = mesh.shape["data"] * (2 * -(-cfg.seq_len // r.page_size) + 1)
  engine = Engine(model, num_slots=len(prompts) * r.group_size,
                  max_prompt_len=cfg.task.max_prompt_len, max_len=cfg.seq_len, mesh=mesh,
                  paged_kv=True, page_size=r.page_size, num_pages=pages, paged_impl=impl,
                  steps_per_call=r.steps_per_call)
  kernel = engine._paged.kernel  # pylint: disable=protected-access
  out = GroupSampler(engine).sample_groups(prompts, group_size=r.group_size,
                                           max_new_tokens=r.max_new_tokens, temperature=1.0,
                                           seed=cfg.seed, eos_ids=task.eos_ids)
  return out, kernel


def scored_batch(cfg, rollout, prompts):
  """The trainer's MiniBatch of the rollout (packed), with fixed random advantages (a random
  policy earns none, and a zero advantage would make every loss 0)."""
  n, g = rollout.lengths.shape
  zeros = np.zeros((n, g), np.float32)
  groups = groups_lib.Groups(
      prompts=prompts, answers=[""] * n, tokens=rollout.tokens, behav_logp=rollout.logprobs,
      versions=rollout.versions, lengths=rollout.lengths, truncated=rollout.truncated,
      correct=zeros > 0, parsed=zeros > 0, score=zeros, reward=zeros)
  # Positive: a mean of mixed signs can sit near 0, where a relative difference means nothing.
  adv = (0.5 + np.abs(np.random.default_rng(0).normal(size=(n, g)))).astype(np.float32)
  batch, _ = groups_lib.training_batch(groups, adv, seq_len=cfg.seq_len, overlong_filter=False)
  return dataclasses.replace(batch, pack=logprob_pass.plans(cfg, batch))


def _update_terms(cfg, model, batch, mesh):
  """(loss per mini-batch, the trainer's response log-probs [B, S], gradient norm) of a step's
  first updates on `mesh`: the old log-probs by the log-prob pass (as the loop recomputes
  them), then each mini-batch's loss and gradients with truncated IS on the sampler's."""
  graphdef, params = nnx.split(model, nnx.Param)
  run = types.SimpleNamespace(cfg=cfg, mesh=mesh, model=types.SimpleNamespace(graphdef=graphdef))
  old, _ = logprob_pass.batched_logprobs(run, params, batch, with_entropy=False)
  batch = dataclasses.replace(batch, old_logp_BxS=old)
  fn = jax.jit(lambda p, mb: objective.loss_and_grad(p, graphdef, mb, cfg, mesh=mesh))
  rows, losses, sq = cfg.minibatch_seqs, [], 0.0
  for i in range(0, batch.num_seqs, rows):
    loss, grads, _, _ = fn(params, batch.rows(i, i + rows))
    losses.append(float(loss))
    sq += float(sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in jax.tree.leaves(grads)))
  return np.asarray(losses), old, sq ** 0.5


def _models(pod, f32, ref, task, devices):
  """The same weights three ways: the pod model (bf16 compute, float32 weights) and a float32
  one on fsdp 2 x tensor 2, the reference (float32) on one device; and the two meshes."""
  mesh = sharding.make_mesh({"data": 1, "fsdp": 2, "tensor": 2}, devices)
  pod_model, _ = setup.build_model(pod, mesh, task.tokenizer)
  params = nnx.state(pod_model, nnx.Param)
  f32_model, _ = setup.build_model(f32, mesh, task.tokenizer)
  nnx.update(f32_model, params)
  one = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1}, devices[:1])
  ref_model, _ = setup.build_model(ref, one, task.tokenizer)
  nnx.update(ref_model, jax.device_put(params, jax.sharding.NamedSharding(
      one, jax.sharding.PartitionSpec())))
  return (pod_model, f32_model, ref_model), (mesh, one)


def _context_model(f32, params, task, devices):
  """The float32 splash model on a context-parallel mesh (each row's tokens over 2 devices,
  heads over 2; splash per shard), holding `params`, and its config and mesh."""
  cfg = dataclasses.replace(f32, mesh=dataclasses.replace(f32.mesh, data=1, fsdp=-1,
                                                          context=CONTEXT))
  mesh = placement.build_mesh(cfg, devices)
  model, _ = setup.build_model(cfg, mesh, task.tokenizer)
  nnx.update(model, jax.device_put(params, sharding.model_shardings(model, mesh)))
  return cfg, model, mesh


def rehearsal_config(tokenizer: str):
  return config_lib.parse(pod_rehearsal_cpu.get_config(f"tokenizer={tokenizer}"))


def run(cfg, num_prompts: int, devices=None) -> dict:
  """The figures rehearse_pod.py reports, with the checks that failed (empty: all held).
  `devices`: 4 CPU devices, not all of the process's (default: the first 4)."""
  # remat off: interpret mode's host callbacks cannot be rematerialised (jax: "Effects not
  # supported in partial-eval of checkpoint/remat"); remat recomputes the same maths.
  pod = _variant(cfg, attention_impl="splash", remat=False)
  f32 = _variant(cfg, dtype="float32", attention_impl="splash", remat=False)
  ref = _variant(cfg, dtype="float32", attention_impl="blocked", remat=False)
  task = setup.load_task(cfg)
  # A fifth device stays idle: the interpret-mode deadlock guard (models/attention_shard.py).
  devices = jax.devices()[:4] if devices is None else devices
  (pod_model, f32_model, ref_model), (mesh, one) = _models(pod, f32, ref, task, devices)
  cp, cp_model, cp_mesh = _context_model(f32, nnx.state(f32_model, nnx.Param), task, devices)
  sampler_mesh = placement.build_sampler_mesh(cfg, devices)
  prompts = prompts_of(cfg, task, num_prompts)
  executed, timer = [], metrics.PhaseTimer()
  with pltpu.force_tpu_interpret_mode():
    with timer("sample_paged_kernel"):
      rollout, kernel = _sample(pod_model, cfg, sampler_mesh, prompts, task, "tpu_kernel")
    if kernel == "tpu":
      executed.append("paged_attention")
    batch = scored_batch(cfg, rollout, prompts)
    if attention.resolve(pod.model.attention_impl, mesh) == "splash":
      executed.append("splash_attention")
    with timer("score_splash_bf16"):
      pod_terms = _update_terms(pod, pod_model, batch, mesh)
    with timer("score_splash_f32"):
      f32_terms = _update_terms(f32, f32_model, batch, mesh)
    with timer("score_splash_f32_context"):
      cp_terms = _update_terms(cp, cp_model, batch, cp_mesh)
  with timer("sample_gather"):
    gather, _ = _sample(pod_model, cfg, sampler_mesh, prompts, task, "reference")
  with timer("score_reference"):
    ref_terms = _update_terms(ref, ref_model, batch, one)
  out = _figures(executed, batch, rollout, gather, pod_terms, f32_terms, ref_terms, cp_terms)
  # each phase's wall time, compiles included
  out["detail"]["seconds"] = {k: round(v, 1) for k, v in timer.seconds.items()}
  return out


def _figures(executed, batch, rollout, gather, pod_terms, f32_terms, ref_terms,
             cp_terms) -> dict:
  resp = batch.loss_mask_BxS > 0
  diff = lambda a, b: float(np.max(np.abs(a - b)[resp])) if resp.any() else 0.0
  loss_rel = lambda a: float(np.max(np.abs(a[0] - ref_terms[0]) / np.abs(ref_terms[0])))
  same_tokens = bool(np.array_equal(rollout.tokens, gather.tokens))
  paged = float(np.max(np.abs(rollout.logprobs - gather.logprobs))) if same_tokens else None
  detail = {
      "tokens_scored": int(resp.sum()),
      "kernel_only_logp_abs_diff_max": diff(f32_terms[1], ref_terms[1]),
      "kernel_only_loss_rel_diff_max": loss_rel(f32_terms),
      "context_parallel_loss_rel_diff_max": loss_rel(cp_terms),
      "context_parallel_grad_norm": cp_terms[2],
      "grad_norm": {"pod_bf16": pod_terms[2], "kernels_f32": f32_terms[2],
                    "reference": ref_terms[2]},
      "sampler_bf16_vs_reference_logp_abs_diff_max": diff(batch.behav_logp_BxS, ref_terms[1]),
      "paged_kernel_same_tokens_as_gather": same_tokens,
      "paged_preemptions": {"kernel": rollout.stats["preemptions"],
                            "gather": gather.stats["preemptions"]},
      "paged_kernel_vs_gather_logp_abs_diff_max": paged,
      "tolerances": TOL}
  out = {"kernels_executed": sorted(executed), "logp_abs_diff_max": diff(pod_terms[1],
                                                                        ref_terms[1]),
         "loss_rel_diff_max": loss_rel(pod_terms),
         "context_parallel_logp_abs_diff_max": diff(cp_terms[1], ref_terms[1]),
         "detail": detail}
  out["failures"] = _failures(out, detail)
  return out


def _failures(out, d) -> list[str]:
  checks = [
      (set(out["kernels_executed"]) == {"paged_attention", "splash_attention"},
       f"kernels executed: {out['kernels_executed']}"),
      (d["kernel_only_logp_abs_diff_max"] <= TOL["kernel_logp"],
       f"float32 splash vs blocked |dlogp| {d['kernel_only_logp_abs_diff_max']:.3g}"),
      (out["context_parallel_logp_abs_diff_max"] <= TOL["kernel_logp"],
       f"float32 context-parallel splash vs blocked |dlogp| "
       f"{out['context_parallel_logp_abs_diff_max']:.3g}"),
      (out["logp_abs_diff_max"] <= TOL["logp"], f"bf16 |dlogp| {out['logp_abs_diff_max']:.3g}"),
      (out["loss_rel_diff_max"] <= TOL["loss_rel"],
       f"bf16 loss relative difference {out['loss_rel_diff_max']:.3g}"),
      (d["paged_kernel_same_tokens_as_gather"], "paged kernel drew other tokens than the gather"),
      (d["paged_kernel_vs_gather_logp_abs_diff_max"] is None or
       d["paged_kernel_vs_gather_logp_abs_diff_max"] <= TOL["paged_logp"],
       f"paged kernel |dlogp| {d['paged_kernel_vs_gather_logp_abs_diff_max']}")]
  return [msg for ok, msg in checks if not ok]
