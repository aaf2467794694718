"""The machine's float32 matmul peak through JAX (best of `--reps` 2048^3 GEMMs), the
denominator of every "% of roofline" figure (torch's: peers/torch_matmul.py).

    python benchmarks/bench_matmul.py --json=F      # F: {"gflops": ...}
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=2048)
  ap.add_argument("--reps", type=int, default=5)
  ap.add_argument("--json")
  args = ap.parse_args()
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  a = jnp.ones((args.n, args.n), jnp.float32)
  f = jax.jit(lambda x, y: x @ y)
  f(a, a).block_until_ready()
  load0, best = common.loadavg(), float("inf")
  for _ in range(args.reps):
    t0 = time.perf_counter()
    f(a, a).block_until_ready()
    best = min(best, time.perf_counter() - t0)
  common.write_json(args.json, dict(side="jax matmul", gflops=2 * args.n**3 / best / 1e9,
                                    loadavg_before=load0, loadavg_after=common.loadavg()))


if __name__ == "__main__":
  main()
