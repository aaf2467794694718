"""Rollout throughput of dapo_jax's `sample_groups` (JAX only; the HF peer is peers/hf_generate.py).

    python benchmarks/bench_sampler.py --model=HF_DIR --json=out.json
    python benchmarks/bench_sampler.py --size=tiny            # a random model made on the fly
    python benchmarks/bench_sampler.py --size=tiny --paged_kv=1   # the paged KV cache
    python benchmarks/bench_sampler.py --size=small --lora_rank=16 --lora_decode=adapters
    python benchmarks/bench_sampler.py --size=small --lora_rank=16 --lora_decode=merged
      # a LoRA policy (every projection, trained-like adapters): decode applying the adapters
      # per projection, or with them merged into the weights (models/lora.py)

16 prompts x 16 samples, 64-token random prompts (ids >= 4), 128 new tokens, temperature 1,
no EOS (every response is full length). One warm-up call (compilation), then `--reps` timed
calls in this process; `tok_per_s` is their median, `cpu_s_per_call` each call's process CPU. `flops_per_token` counts the projections,
the causal attention over the real context and the LM head of each generated token plus the
prefills (dapo_jax.rollout.flops), so tok/s x flops_per_token / the matmul peak
(bench_matmul.py) is the fraction of the compute roofline reached.
"""
import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dapo_jax
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position


def useful_flops(cfg, *, n: int, g: int, p_len: int, new: int) -> int:
  from dapo_jax.rollout import flops  # pylint: disable=g-import-not-at-top
  decode = n * g * sum(flops.decode_flops(cfg, p_len + t + 1) for t in range(new))
  return decode + n * flops.prefill_flops(cfg, p_len)


def run(model_dir: str, args) -> dict:
  from dapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from dapo_jax.rollout.sampler import make_sampler  # pylint: disable=g-import-not-at-top
  model, cfg = hf_io.load_pretrained(model_dir)
  if args.lora_rank:
    model = lora_policy(model, args.lora_rank, merged=args.lora_decode == "merged")
  n, g, p, new = args.prompts, args.group, args.prompt_len, args.new
  rng = np.random.default_rng(0)
  prompts = rng.integers(4, cfg.vocab_size, size=(n, p)).tolist()
  sampler = make_sampler(model, num_slots=n * g, max_prompt_len=p, max_len=p + new,
                         paged_kv=bool(args.paged_kv))
  kw = dict(group_size=g, max_new_tokens=new, temperature=1.0)
  sampler.sample_groups(prompts, seed=1, **kw)  # warm-up: compilation
  load0, rates, cpu = common.loadavg(), [], []
  for rep in range(args.reps):
    c0 = time.process_time()
    r = sampler.sample_groups(prompts, seed=2 + rep, **kw)
    cpu.append(time.process_time() - c0)
    if not (r.lengths == new).all():
      raise AssertionError("every response must be full length (no EOS)")
    rates.append(r.stats["tokens_per_s"])
  fl = useful_flops(cfg, n=n, g=g, p_len=p, new=new)
  s = common.summary(rates)
  return dict(side="dapo_jax sample_groups", tok_per_s=s["median"], tok_per_s_range=s,
              flops_per_token=fl / (n * g * new), loadavg_before=load0,
              loadavg_after=common.loadavg(), decode_steps=r.stats["decode_steps"],
              cpu_s_per_call=cpu, paged_kv=bool(args.paged_kv), lora_rank=args.lora_rank,
              lora_decode=args.lora_decode if args.lora_rank else None,
              setting=dict(prompts=n, group=g, prompt_len=p, new=new))


def lora_policy(model, rank: int, *, merged: bool):
  """`model` with rank-`rank` adapters on every projection, B drawn N(0, 0.02^2) (as after
  training, not PEFT's zeros); `merged`: the same policy with the adapters merged in."""
  import jax  # pylint: disable=g-import-not-at-top
  from dapo_jax.models import lora  # pylint: disable=g-import-not-at-top
  lora.attach(model, rank=rank, alpha=2.0 * rank, targets=",".join(lora.TARGETS), seed=0)
  graphdef, adapters, frozen = lora.split(model)
  adapters = jax.tree.map(lambda x: x + 0.02 * jax.random.normal(jax.random.key(1), x.shape),
                          adapters)
  model = lora.merge(graphdef, (adapters, frozen))
  return lora.merged_model(model) if merged else model


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", help="HF model directory (default: a random --size model)")
  ap.add_argument("--size", default="tiny", choices=sorted(common.MODELS))
  ap.add_argument("--prompts", type=int, default=16)
  ap.add_argument("--group", type=int, default=16)
  ap.add_argument("--prompt_len", type=int, default=64)
  ap.add_argument("--new", type=int, default=128)
  ap.add_argument("--reps", type=int, default=2, help="timed calls after the warm-up")
  ap.add_argument("--paged_kv", type=int, default=0, help="1: the paged KV cache")
  ap.add_argument("--lora_rank", type=int, default=0, help="> 0: a LoRA policy of this rank")
  ap.add_argument("--lora_decode", default="adapters", choices=("adapters", "merged"),
                  help="LoRA: apply the adapters in decode, or decode merged weights")
  ap.add_argument("--json", help="write the result here")
  args = ap.parse_args()
  with tempfile.TemporaryDirectory() as tmp:
    model_dir = args.model or common.make_model_dir(args.size, tmp)
    common.write_json(args.json, run(model_dir, args))


if __name__ == "__main__":
  main()
