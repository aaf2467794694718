"""bf16 sampler vs float32 trainer on a real model: how far apart their log-probs of the
sampled tokens are, and how many tokens the IS correction would act on.

SmolLM2-135M-Instruct (the shipped GGUF, imported by dapo_jax.models.gguf_import) samples G
responses to each of the first `--prompts` prompts of configs/smollm2_cpu.py's task (ChatML
template, temperature 1.0 as the paper) and the trainer's log-prob pass (packed rows, the
loop's own code) scores the same tokens. Three pairs:

  bf16_sampler__f32_trainer    the sampler's weights and compute in bf16; the trainer float32
  bf16_sampler__bf16_trainer   the same samples; the trainer computes in bf16 over float32
                               master weights (configs/dapo_qwen25_32b.py's setting)
  f32_sampler__f32_trainer     both float32 (the floor: kernels and batch shapes only)
  int8_sampler__f32_trainer    the sampler's layer projections int8 per channel (rollout.
                               weight_dtype="int8", models/quant.py), compute float32
`--samplers` picks them (default bf16,f32: the first three).

Per pair (metrics.mismatch_figures, the same figures every run logs): |dlogp| percentiles
and max, k1 / k3 KL estimates, the share of tokens tis_token at `--is_cap` truncates and
mask_token drops; and per sequence, the share whose sequence ratio e^{sum dlogp} tis_seq
truncates and mask_seq drops; and `family`: the share verl's correction family
(core.offpolicy: FAMILY below, thresholds recorded) truncates or rejects, per kind.

COMMAND:
  python -m dapo_jax.models.gguf_import --out=runs/smollm2_135m_hf     # once (~25 s)
  python experiments/bf16_mismatch.py --hf_path=runs/smollm2_135m_hf \\
      --json=experiments/results/bf16_mismatch_smollm2.json
EXPECTED: 18.5 min on a 2-core CPU on 2026-12-03 (bf16 matmuls are slow on XLA:CPU); figures
  in docs/async.md ("bf16 sampler vs float32 trainer").
"""
import argparse
import datetime
import json
import math
import os
import sys
import time
import types

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "experiments"))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
sys.path.insert(0, REPO)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

import bench_common  # noqa: E402  pylint: disable=wrong-import-position
import rehearse_kernels  # noqa: E402  pylint: disable=wrong-import-position
from configs import smollm2_cpu  # noqa: E402
from dapo_jax import config as config_lib, metrics, sharding  # noqa: E402
from dapo_jax.core import offpolicy  # noqa: E402
from dapo_jax.rollout.engine import Engine  # noqa: E402
from dapo_jax.rollout.sampler import GroupSampler  # noqa: E402
from dapo_jax.train import logprob_pass, setup  # noqa: E402


def _flags(argv):
  p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
  p.add_argument("--hf_path", default="runs/smollm2_135m_hf",
                 help="SmolLM2-135M-Instruct as an HF directory (gguf_import's --out)")
  p.add_argument("--prompts", type=int, default=32, help="prompts sampled")
  p.add_argument("--group_size", type=int, default=4, help="responses per prompt")
  p.add_argument("--max_new_tokens", type=int, default=96, help="tokens per response at most")
  p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature")
  p.add_argument("--is_cap", type=float, default=2.0, help="IS cap / band [1/cap, cap]")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--samplers", default="bf16,f32", help="comma list of bf16, f32, int8")
  p.add_argument("--json", default=None, help="write the figures here")
  args = p.parse_args(argv)
  for name in ("prompts", "group_size", "max_new_tokens"):
    if getattr(args, name) < 1:
      p.error(f"--{name}: must be >= 1, got {getattr(args, name)}")
  if not args.temperature > 0:
    p.error(f"--temperature: must be > 0 (greedy samples have no spread), got {args.temperature}")
  bad = sorted(set(args.samplers.split(",")) - {"bf16", "f32", "int8"})
  if bad or not args.samplers:
    p.error(f"--samplers: unknown {bad or 'none'}; expected a comma list of bf16, f32, int8")
  if not args.is_cap > 1:
    p.error(f"--is_cap: must be > 1, got {args.is_cap}")
  if not os.path.isfile(os.path.join(setup.resolve_path(args.hf_path), "config.json")):
    p.error(f"--hf_path: no config.json in {args.hf_path!r}; make it with "
            "python -m dapo_jax.models.gguf_import --out=DIR")
  return args


def _config(args, dtype: str):
  """configs/smollm2_cpu.py with the sampling shape of the flags; `dtype` the compute dtype
  (the sampler keeps its weights in it; float32 master weights either way)."""
  n, g = args.prompts, args.group_size
  c = smollm2_cpu.get_config(f"hf_path={args.hf_path}")
  c.model.dtype, c.model.param_dtype = dtype, "float32"
  c.rollout.group_size, c.rollout.max_new_tokens = g, args.max_new_tokens
  c.rollout.temperature, c.rollout.num_slots = args.temperature, min(n * g, 128)
  c.train.batch_size, c.train.num_minibatches = n, 1  # one pass scores every sequence
  c.train.micro_batch_size = min(n * g, 16)            # sequences per slice (host memory)
  c.algo.is_cap, c.seed = args.is_cap, args.seed
  c.algo.overlong_cache_len = min(c.algo.overlong_cache_len, args.max_new_tokens)  # short runs
  return config_lib.parse(c)


def _sample(model, cfg, mesh, prompts, task, weight_dtype="auto"):
  r = cfg.rollout
  engine = Engine(model, num_slots=r.num_slots, max_prompt_len=cfg.task.max_prompt_len,
                  max_len=cfg.seq_len, mesh=mesh, weight_dtype=weight_dtype)  # auto: model dtype
  return GroupSampler(engine).sample_groups(
      prompts, group_size=r.group_size, max_new_tokens=r.max_new_tokens,
      temperature=r.temperature, seed=cfg.seed, eos_ids=task.eos_ids)


def _score(cfg, model, mesh, batch):
  """The trainer's log-probs [B, S] of the batch's tokens (the loop's log-prob pass)."""
  graphdef, params = nnx.split(model, nnx.Param)
  run = types.SimpleNamespace(cfg=cfg, mesh=mesh, model=types.SimpleNamespace(graphdef=graphdef))
  logp, _ = logprob_pass.batched_logprobs(run, params, batch, with_entropy=False)
  return logp


def pair_figures(trainer_logp, batch, is_cap: float) -> dict:
  """metrics.mismatch_figures on the response tokens, plus the sequence-level shares."""
  mask = np.asarray(batch.loss_mask_BxS) > 0
  sampler_logp = np.asarray(batch.behav_logp_BxS, np.float64)
  out = metrics.mismatch_figures(trainer_logp, sampler_logp, mask, is_cap=is_cap)
  seq = np.where(mask, np.asarray(trainer_logp, np.float64) - sampler_logp, 0.0).sum(axis=1)
  log_cap = math.log(is_cap)
  out["seq_capped_frac"] = float(np.mean(seq > log_cap))
  out["seq_outside_frac"] = float(np.mean(np.abs(seq) > log_cap))
  out["seq_abs_logratio_max"] = float(np.abs(seq).max())
  out["family"] = family_figures(trainer_logp, sampler_logp, mask)
  return out


# (kind, keyword arguments) of core.offpolicy measured per pair: IS shares truncated / zeroed,
# rejection shares of tokens and of sequences
FAMILY = (("is token 2.0", dict(level="token", threshold="2.0")),
          ("is token 0.5_2.0", dict(level="token", threshold="0.5_2.0")),
          ("is sequence 2.0", dict(level="sequence", threshold="2.0")),
          ("rs token_k1 2.0", dict(options="token_k1", thresholds="2.0")),
          ("rs seq_mean_k1 0.99_1.01", dict(options="seq_mean_k1", thresholds="0.99_1.01")),
          ("rs seq_mean_k3 0.001", dict(options="seq_mean_k3", thresholds="0.001")),
          ("rs seq_max_k3 0.1", dict(options="seq_max_k3", thresholds="0.1")))


def family_figures(trainer_logp, sampler_logp, mask) -> dict:
  lr = np.where(mask, np.asarray(trainer_logp, np.float64) - sampler_logp, 0.0).astype(np.float32)
  m = mask.astype(np.float32)
  out = {}
  for name, kw in FAMILY:
    if name.startswith("is"):
      _, aux = offpolicy.is_weights(lr, m, **kw)
      out[name] = {"outside_frac": float(aux["is_outside_frac"]), "ess": float(aux["is_ess"])}
    else:
      _, aux = offpolicy.rejection_mask(lr, m, **kw)
      out[name] = {"token_frac": float(aux["rs_token_frac"]),
                   "seq_frac": float(aux["rs_seq_frac"])}
  return out


def run(args) -> dict:
  t0 = time.perf_counter()
  cfg32, cfg16 = _config(args, "float32"), _config(args, "bfloat16")
  mesh = sharding.make_mesh({"data": 1, "fsdp": 1, "tensor": 1})
  task = setup.load_task(cfg32)
  f32_model, _ = setup.build_model(cfg32, mesh, task.tokenizer)
  bf16_model, _ = setup.build_model(cfg16, mesh, task.tokenizer)  # float32 master weights
  prompts = rehearse_kernels.prompts_of(cfg32, task, args.prompts)
  out = {}
  samplers = {"bf16": (bf16_model, "auto"), "f32": (f32_model, "auto"), "int8": (f32_model, "int8")}
  for sampler_dtype in args.samplers.split(","):
    sampler_model, weight_dtype = samplers[sampler_dtype]
    rollout = _sample(sampler_model, cfg32, mesh, prompts, task, weight_dtype)
    batch = rehearse_kernels.scored_batch(cfg32, rollout, prompts)
    scorers = (("f32", cfg32, f32_model), ("bf16", cfg16, bf16_model))
    for trainer_dtype, cfg, model in scorers[:2 if sampler_dtype == "bf16" else 1]:
      figures = pair_figures(_score(cfg, model, mesh, batch), batch, args.is_cap)
      figures["tokens"] = int((np.asarray(batch.loss_mask_BxS) > 0).sum())
      figures["truncated_frac"] = float(np.mean(rollout.truncated))
      out[f"{sampler_dtype}_sampler__{trainer_dtype}_trainer"] = figures
  return {"model": "SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32)",
          "task": cfg32.task.name, "prompts": args.prompts, "group_size": args.group_size,
          "max_new_tokens": args.max_new_tokens, "temperature": args.temperature,
          "is_cap": args.is_cap, "seed": args.seed, "pairs": out,
          "host": bench_common.host(),
          "date": datetime.date.today().isoformat(),
          "wall_s": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
  args = _flags(argv)
  result = run(args)
  text = json.dumps(result, indent=1)
  print(text)
  if args.json:
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w", encoding="utf-8") as f:
      f.write(text + "\n")
  return 0


if __name__ == "__main__":
  sys.exit(main())
