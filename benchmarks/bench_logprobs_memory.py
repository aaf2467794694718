"""Peak memory of chunked vs naive per-token log-probs at Qwen2.5's vocabulary (V = 152,064).

  python benchmarks/bench_logprobs_memory.py            # compile-only, ~1 min on 2 cores
  python benchmarks/bench_logprobs_memory.py --run      # also time one chunked forward

8 sequences x 4,096 tokens, a 1-layer model with hidden size 64 (so the LM head dominates).
Peak = arguments + outputs + temporaries of the compiled XLA program
(`jit(f).lower(...).compile().memory_analysis()`); nothing is allocated to measure it, so the
naive program (a float32 [8, 4096, 152064] = 19.9 GB logits tensor) is only compiled.
Expected: chunked forward and forward+backward stay under 2 GiB; naive needs ~20-60 GiB.
"""
from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from dapo_jax.models.config import ModelConfig  # noqa: E402
from dapo_jax.models.qwen2 import Qwen2, token_logprobs  # noqa: E402

GIB = 2**30


def naive_logprobs(model, toks, mask):
  """The textbook version: full [B, T, V] float32 logits, then log-softmax and a gather."""
  logits = model(toks, mask)
  logp_all = jax.nn.log_softmax(logits[:, :-1], axis=-1)
  logp = jnp.take_along_axis(logp_all, toks[:, 1:, None], axis=-1)[..., 0]
  ent = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  pad = jnp.zeros((toks.shape[0], 1))
  return jnp.concatenate([pad, logp], 1) * mask, jnp.concatenate([pad, ent], 1) * mask


def peak_bytes(fn, *args) -> tuple[int, float]:
  t0 = time.time()
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  peak = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
  return peak - m.alias_size_in_bytes, time.time() - t0


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--batch", type=int, default=8)
  ap.add_argument("--seq", type=int, default=4096)
  ap.add_argument("--vocab", type=int, default=152064)
  ap.add_argument("--hidden", type=int, default=64)
  ap.add_argument("--chunk", type=int, default=512, help="tokens per log-prob chunk")
  ap.add_argument("--run", action="store_true", help="also execute the chunked forward once")
  a = ap.parse_args()
  cfg = ModelConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=2 * a.hidden,
                    num_layers=1, num_heads=2, num_kv_heads=1, head_dim=a.hidden // 2,
                    logits_chunk=a.chunk)
  abstract = nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  toks = jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)
  mask = jax.ShapeDtypeStruct((a.batch, a.seq), jnp.int32)

  def fwd(impl):
    return lambda s, t, m: impl(nnx.merge(graphdef, s), t, m)

  def fwd_bwd(impl):
    def loss(s, t, m):
      logp, ent = impl(nnx.merge(graphdef, s), t, m)
      return jnp.sum(logp) + 0.01 * jnp.sum(ent)
    return jax.grad(loss)

  full_logits = a.batch * a.seq * a.vocab * 4
  print(f"B={a.batch} T={a.seq} V={a.vocab} D={a.hidden} chunk={a.chunk} tokens; "
        f"params {cfg.num_params * 4 / GIB:.3f} GiB; "
        f"one float32 [B,T,V] = {full_logits / GIB:.2f} GiB")
  rows = {}
  for name, impl in (("chunked", token_logprobs), ("naive", naive_logprobs)):
    for kind, make in (("forward", fwd), ("forward+backward", fwd_bwd)):
      peak, secs = peak_bytes(make(impl), state, toks, mask)
      rows[(name, kind)] = peak
      print(f"{name:8s} {kind:17s} peak {peak / GIB:8.3f} GiB   (compiled in {secs:.1f}s)")
  for kind in ("forward", "forward+backward"):
    ratio = rows[("naive", kind)] / rows[("chunked", kind)]
    print(f"{kind}: naive / chunked = {ratio:.1f}x; chunked under 2 GiB: "
          f"{rows[('chunked', kind)] < 2 * GIB}")
  if a.run:
    model = Qwen2(cfg, rngs=nnx.Rngs(0))
    t = jax.random.randint(jax.random.key(0), (a.batch, a.seq), 0, a.vocab)
    m = jnp.ones((a.batch, a.seq), jnp.int32)
    f = nnx.jit(lambda mdl, t, m: token_logprobs(mdl, t, m))
    jax.block_until_ready(f(model, t, m))
    t0 = time.time()
    logp, _ = jax.block_until_ready(f(model, t, m))
    print(f"chunked forward ran in {time.time() - t0:.1f}s; mean logp {float(logp.mean()):.3f}")


if __name__ == "__main__":
  main()
