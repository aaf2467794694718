"""Every figure of the peer comparison (docs/performance.md) in one command: each side in its
own process, one process at a time, sides interleaved (A, B, A, B, ...), `--procs` processes per
side, medians and ranges.

    python benchmarks/run_all.py --json=perf.json [--peer_python=/tmp/peer_venv/bin/python]
        [--models=tiny,small] [--procs=3] [--skip=rl_step]

Makes the random models (benchmarks/bench_common.py) under --workdir, then runs: the matmul
peak (bench_matmul.py), the sampler (bench_sampler.py vs peers/hf_generate.py), the update
(bench_update.py vs peers/torch_update.py) and one RL step (bench_rl_step.py vs
peers/trl_step.py, TRL's GRPOTrainer at the same setting: 16 prompts x 16 samples, 64 + 128
tokens, one update). Peers run only with --peer_python (a venv holding requirements-bench.txt).
Prints a table of medians, the load average before and after, and writes everything as JSON.
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # dapo_jax, for the random models
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position

os.environ.setdefault("JAX_PLATFORMS", "cpu")
JAX_ENV = dict(os.environ, JAX_PLATFORMS="cpu")


def sides(model_dir: str, peer: str | None) -> dict:
  """name -> (python, script, args) of every measured side of one model."""
  py, m = sys.executable, f"--model={model_dir}"
  out = {"matmul": (py, "bench_matmul.py", []),
         "sampler": (py, "bench_sampler.py", [m]),
         "update": (py, "bench_update.py", [m, "--batch=16", "--seq=512"]),
         "rl_step": (py, "bench_rl_step.py", [m, "--prompts=16", "--group=16",
                                               "--prompt_len=64", "--new=128", "--steps=4"])}
  if peer:
    out["hf_generate"] = (peer, "peers/hf_generate.py", [m])
    out["torch_update"] = (peer, "peers/torch_update.py", [m, "--batch=16", "--seq=512"])
    out["trl_step"] = (peer, "peers/trl_step.py", out["rl_step"][2])
  return out


def run_one(python: str, script: str, args: list, out: str) -> dict:
  subprocess.run([python, os.path.join(HERE, script), *args, f"--json={out}"], check=True,
                 env=JAX_ENV, stdout=subprocess.DEVNULL)
  with open(out) as f:
    return json.load(f)


def measure(model_dir: str, args) -> dict:
  todo = {k: v for k, v in sides(model_dir, args.peer_python).items()
          if k not in args.skip.split(",")}
  runs = {k: [] for k in todo}
  for i in range(args.procs):  # interleaved: every side once per round
    for name, (py, script, a) in todo.items():
      runs[name].append(run_one(py, script, a, os.path.join(args.workdir, f"{name}_{i}.json")))
      print(f"  {name} #{i}: " + json.dumps({k: v for k, v in runs[name][-1].items()
                                            if not isinstance(v, dict)}), flush=True)
  key = {"matmul": "gflops", "rl_step": "step_s", "trl_step": "step_s"}
  return {k: dict(runs=v, median=common.summary([r[key.get(k, "tok_per_s")] for r in v]))
          for k, v in runs.items()}


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--models", default="tiny,small")
  ap.add_argument("--procs", type=int, default=3)
  ap.add_argument("--peer_python", help="python of a venv with requirements-bench.txt")
  ap.add_argument("--skip", default="", help="comma-separated sides not to run")
  ap.add_argument("--workdir", default="/tmp/dapo_jax_bench")
  ap.add_argument("--json")
  args = ap.parse_args()
  os.makedirs(args.workdir, exist_ok=True)
  result = {"host": common.host(), "loadavg_before": common.loadavg()}
  print(f"host: {result['host']['model']}, {result['host']['cpus']} CPUs", flush=True)
  for size in args.models.split(","):
    model_dir = os.path.join(args.workdir, size)
    if not os.path.exists(os.path.join(model_dir, "config.json")):
      common.make_model_dir(size, model_dir)
    print(f"[{size}]", flush=True)
    result[size] = measure(model_dir, args)
    for name, r in result[size].items():
      med = r["median"]
      print(f"  {name:13s} median {med['median']:10.1f}  (min {med['min']:.1f}, max "
            f"{med['max']:.1f}, {med['n']} processes)")
  result["loadavg_after"] = common.loadavg()
  common.write_json(args.json, result)


if __name__ == "__main__":
  main()
