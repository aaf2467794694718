"""Rollout throughput: `sample_groups` vs Hugging Face `generate` (torch CPU) on the same model.

    python benchmarks/bench_sampler.py               # the issue's setting (~5-10 min on 2 cores)
    python benchmarks/bench_sampler.py --quick       # a smoke run with small shapes

For each model (tiny: d 256, 4 layers, 4 heads / 2 KV heads, vocab 512; small: d 512, 8 layers,
8 / 2 heads, vocab 4096; head_dim 64, MLP 4d) a random Qwen2 is built with transformers, saved as
safetensors and loaded into dapo_jax with hf_io, so both sides run identical weights. Both sample
16 prompts x 16 responses of 128 new tokens after 64-token prompts, temperature 1, no top-p/top-k,
no EOS (every response is full length), with a KV cache; HF batches the 16 prompts with
num_return_sequences=16 (it prefills each prompt 16 times; dapo_jax prefills it once).
Timed after one warm-up call (compilation excluded), one timed run each. Also prints the
machine's float32 matmul peak (best of a 2048^3 matmul in JAX and torch) and the fraction of it
the sampler's useful matmul FLOPs reach, and the prefill FLOPs saved by fan-out.
"""
import argparse
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.models import hf_io
from dapo_jax.rollout import flops
from dapo_jax.rollout.sampler import make_sampler

MODELS = {
    "tiny": dict(hidden_size=256, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
    "small": dict(hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
                  num_attention_heads=8, num_key_value_heads=2, vocab_size=4096),
}


def matmul_peak_gflops(n: int = 2048, reps: int = 5) -> dict:
  """Best float32 GEMM rate of this machine through JAX and through torch."""
  import torch  # pylint: disable=g-import-not-at-top
  a = jnp.ones((n, n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  best_j = min(_timed(lambda: f(a, a).block_until_ready()) for _ in range(reps))
  t = torch.ones((n, n))
  torch.mm(t, t)
  best_t = min(_timed(lambda: torch.mm(t, t)) for _ in range(reps))
  fl = 2 * n**3
  return {"jax": fl / best_j / 1e9, "torch": fl / best_t / 1e9}


def _timed(fn) -> float:
  t0 = time.perf_counter()
  fn()
  return time.perf_counter() - t0


def build_pair(name: str, tmp: str, max_positions: int):
  """(HF torch model, dapo_jax model, cfg) with identical random weights."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(0)
  hf_cfg = transformers.Qwen2Config(**MODELS[name], max_position_embeddings=max_positions,
                                    tie_word_embeddings=False, rope_theta=1e6,
                                    bos_token_id=None, eos_token_id=None, pad_token_id=0)
  hf = transformers.Qwen2ForCausalLM(hf_cfg).eval()
  path = os.path.join(tmp, name)
  hf.save_pretrained(path)
  model, cfg = hf_io.load_pretrained(path)
  return hf, model, cfg


def hf_generate(hf, prompts_NxP: np.ndarray, *, group: int, new: int, seed: int):
  import torch  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  ids = torch.as_tensor(prompts_NxP, dtype=torch.long)
  with torch.inference_mode():
    out = hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                      temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=group,
                      max_new_tokens=new, min_new_tokens=new, use_cache=True,
                      eos_token_id=None, pad_token_id=0)
  return out[:, prompts_NxP.shape[1]:]


def run(name: str, *, n: int, g: int, p_len: int, new: int, peak: float, tmp: str) -> dict:
  import torch  # pylint: disable=g-import-not-at-top
  hf, model, cfg = build_pair(name, tmp, max_positions=p_len + new)
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, cfg.vocab_size, size=(n, p_len)).astype(np.int32)
  sampler = make_sampler(model, num_slots=n * g, max_prompt_len=p_len, max_len=p_len + new)
  kw = dict(group_size=g, max_new_tokens=new, temperature=1.0, top_p=1.0, top_k=0)
  sampler.sample_groups(prompts.tolist(), seed=1, **kw)  # compile
  r = sampler.sample_groups(prompts.tolist(), seed=2, **kw)
  assert (r.lengths == new).all(), "every response should be full length (no EOS)"
  jax_s = r.stats["wall_time_s"]
  gen = int(r.lengths.sum())

  hf_generate(hf, prompts[:2], group=2, new=4, seed=0)  # warm-up
  t0 = time.perf_counter()
  out = hf_generate(hf, prompts, group=g, new=new, seed=3)
  hf_s = time.perf_counter() - t0
  assert tuple(out.shape) == (n * g, new), out.shape

  decode = n * g * sum(flops.decode_flops(cfg, p_len + t + 1) for t in range(new))
  prefill = n * flops.prefill_flops(cfg, p_len)
  useful = decode + prefill
  return dict(
      model=name, params_m=sum(x.size for x in jax.tree.leaves(sampler.engine.params)) / 1e6,
      jax_tok_s=gen / jax_s, hf_tok_s=n * g * new / hf_s, jax_s=jax_s, hf_s=hf_s,
      speedup=hf_s / jax_s, jax_gflops=useful / jax_s / 1e9,
      peak_frac=useful / jax_s / 1e9 / peak, utilisation=r.stats["slot_utilisation"],
      decode_steps=r.stats["decode_steps"], prefill_flops=prefill,
      prefill_saved=r.stats["prefill_flops_saved"], torch_threads=torch.get_num_threads())


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="tiny,small")
  ap.add_argument("--quick", action="store_true", help="4 prompts x 4, 16-token prompts, 16 new")
  args = ap.parse_args()
  n, g, p_len, new = (4, 4, 16, 16) if args.quick else (16, 16, 64, 128)
  peak = matmul_peak_gflops()
  best = max(peak.values())
  print(f"devices: {jax.devices()}  cores: {os.cpu_count()}")
  print(f"float32 matmul peak (2048^3): JAX {peak['jax']:.1f} GFLOP/s, torch "
        f"{peak['torch']:.1f} GFLOP/s -> peak {best:.1f}")
  print(f"workload: {n} prompts x {g} samples, {p_len}-token prompts, {new} new tokens")
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for name in args.models.split(","):
      rows.append(run(name, n=n, g=g, p_len=p_len, new=new, peak=best, tmp=tmp))
      r = rows[-1]
      print(f"\n[{name}] {r['params_m']:.2f}M params")
      print(f"  dapo_jax sample_groups: {r['jax_s']:.2f} s  {r['jax_tok_s']:.0f} tok/s  "
            f"({r['decode_steps']} decode steps, slot utilisation {r['utilisation']:.3f})")
      print(f"  HF generate (torch, {r['torch_threads']} threads): {r['hf_s']:.2f} s  "
            f"{r['hf_tok_s']:.0f} tok/s")
      print(f"  speed-up vs HF: {r['speedup']:.2f}x")
      print(f"  useful matmul rate {r['jax_gflops']:.1f} GFLOP/s = {100 * r['peak_frac']:.1f} % "
            f"of the measured peak")
      print(f"  prefill FLOPs: {r['prefill_flops'] / 1e9:.2f} GFLOP done, "
            f"{r['prefill_saved'] / 1e9:.2f} GFLOP saved by fan-out ({g - 1}x what was done)")
  print("\nmodel  | dapo_jax tok/s | HF tok/s | ratio | % matmul peak | prefill GFLOP saved")
  for r in rows:
    print(f"{r['model']:6s} | {r['jax_tok_s']:14.0f} | {r['hf_tok_s']:8.0f} | "
          f"{r['speedup']:5.2f} | {100 * r['peak_frac']:13.1f} | {r['prefill_saved'] / 1e9:.2f}")


if __name__ == "__main__":
  main()
