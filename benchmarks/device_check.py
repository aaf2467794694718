"""The steps of benchmarks/device_check.sh, each in its own process, into one JSON.

    python benchmarks/device_check.py --workdir=DIR --out=F [--peer_python=P]   # on a GPU
    python benchmarks/device_check.py --dry_run --workdir=DIR --out=F          # CPU, small

Steps: `kernels` (what "auto" picks on the device mesh for the benchmark model's shapes, and
the custom calls of the compiled training attention and paged decode), the interpret-mode
kernel tests on CPU and the GPU-only tests (tests/test_gpu_device.py), the tiny main job,
bench_update.py and bench_rl_step.py on a random Qwen2 of Qwen2.5-0.5B's shapes with the peak
device memory of each, and the torch update / TRL GRPOTrainer peers on the same device (with
`--peer_python`). A failing step is recorded (exit code, last lines) and the others still run;
the exit code is 1 if any failed. `--dry_run`: the same on CPU at small sizes (tiny model,
short rows, the one-minute main job). `--step=kernels` / `--step=jax_bench` are the
subprocesses' own entry points.
"""
import argparse
import json
import os
import resource
import runpy
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position

# (model size, bench_update args, bench_rl_step / trl_step args, main job config) per mode.
SIZES = {
    "gpu": ("qwen2_0.5b", ["--batch=16", "--seq=512"],
            ["--prompts=16", "--group=16", "--prompt_len=64", "--new=128", "--steps=4"],
            "configs/tiny_cpu.py:runlocal=True"),
    "dry": ("tiny", ["--batch=4", "--seq=64", "--reps=2"],
            ["--prompts=2", "--group=4", "--prompt_len=16", "--new=16", "--steps=2",
             "--micro_batch=8"],
            "configs/tiny_cpu.py:runlocal=True"),
}


def custom_calls(jitted, *args) -> list:
  """The custom-call targets of a compiled function (Pallas kernels show up here)."""
  text = jitted.lower(*args).compile().as_text() or ""
  return sorted({line.split('custom_call_target="')[1].split('"')[0]
                 for line in text.splitlines() if 'custom_call_target="' in line})


def kernels_step(size: str) -> dict:
  """What "auto" runs on a mesh of this process's devices for the model `size`'s shapes."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from dapo_jax import sharding  # pylint: disable=g-import-not-at-top
  from dapo_jax.models import attention, paged  # pylint: disable=g-import-not-at-top
  from dapo_jax.rollout import device_fns  # pylint: disable=g-import-not-at-top
  m = common.MODELS[size]
  devs = jax.devices()
  mesh = sharding.make_mesh({"data": len(devs)}, devs)
  b, t, h, kv, d = len(devs), 512, m["num_heads"], m["num_kv_heads"], m["head_dim"]
  q, k = jnp.zeros((b, t, h, d), jnp.bfloat16), jnp.zeros((b, t, kv, d), jnp.bfloat16)
  seg = jnp.ones((b, t), jnp.int32)
  attend = lambda q, k, v: attention.attend(q, k, v, seg, seg, impl="auto", block=256, mesh=mesh)
  train = jax.jit(jax.value_and_grad(lambda q, k, v: jnp.sum(attend(q, k, v)), argnums=(0, 1, 2)))
  spec = device_fns.paged_spec(mesh, max_len=t, slots=b, page_size=16, head_dim=d)
  per_shard = spec.pages_per_seq + 1  # one row per device: its pages and the null page
  pool = jnp.zeros((kv, b * per_shard, spec.page_size, d), jnp.bfloat16)
  table = (jnp.arange(b, dtype=jnp.int32)[:, None] * per_shard + 1
           + jnp.arange(spec.pages_per_seq, dtype=jnp.int32)[None])
  fn = paged.attend_kernel if spec.kernel else paged.attend_reference
  decode = jax.jit(fn, static_argnums=(6,))
  args = (q[:, :1], pool, pool, table, jnp.full((b,), t - 1, jnp.int32), None, spec)
  return dict(platform=devs[0].platform, device_kind=devs[0].device_kind, devices=len(devs),
              jax=jax.__version__, attention_impl=attention.resolve("auto", mesh),
              paged_kernel=spec.kernel or "reference",
              train_attention_custom_calls=custom_calls(train, q, k, k),
              decode_attention_custom_calls=custom_calls(decode, *args))


def jax_bench_step(script: str, argv: list) -> None:
  """Runs a JAX benchmark script in this process, then adds the peak memory to its JSON."""
  sys.argv = [script, *argv]
  runpy.run_path(os.path.join(HERE, script), run_name="__main__")
  import jax  # pylint: disable=g-import-not-at-top
  out = next(a.split("=", 1)[1] for a in argv if a.startswith("--json="))
  with open(out) as f:
    result = json.load(f)
  stats = jax.local_devices()[0].memory_stats() or {}
  result["peak_bytes"] = stats.get("peak_bytes_in_use")  # the device allocator's (GPU)
  result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
  result["platform"] = jax.local_devices()[0].platform
  with open(out, "w") as f:
    json.dump(result, f, indent=1, sort_keys=True)


def run(name: str, cmd: list, env: dict, log_dir: str) -> dict:
  """One step in its own process: exit code, seconds, the log's last lines if it failed."""
  t0 = time.perf_counter()
  log = os.path.join(log_dir, f"{name}.log")
  with open(log, "w") as f:
    rc = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                        check=False).returncode
  with open(log) as f:
    lines = f.read().splitlines()
  out = dict(rc=rc, wall_s=round(time.perf_counter() - t0, 1), log=log,
             last_line=next((x for x in reversed(lines) if x.strip()), ""))
  if rc:
    out["tail"] = lines[-15:]
  print(f"[device_check] {name}: rc {rc}, {out['wall_s']} s", flush=True)
  return out


PEERS = ("torch_update", "trl_step")


def peers_ready(path, timeout_s: float = 1800) -> bool:
  """Waits for the peers' venv install to write its exit code to `path` (None: nothing to
  wait for); True if it succeeded."""
  t0 = time.perf_counter()
  while path and not os.path.exists(path):
    if time.perf_counter() - t0 > timeout_s:
      return False
    time.sleep(5)
  if not path:
    return True
  with open(path) as f:
    return f.read().strip() == "0"


def evals(results):
  """The main job's held-out figures before and after training (no sample texts)."""
  return results and {k: {m: v for m, v in results[k].items() if isinstance(v, (int, float))}
                      for k in ("before", "after") if isinstance(results.get(k), dict)}


def read_json(path: str):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def steps(args, work: str) -> dict:
  """name -> (command, JAX_PLATFORMS) of every step, in order."""
  size, update, rl, main_cfg = SIZES["dry" if args.dry_run else "gpu"]
  py, model = sys.executable, os.path.join(work, size)
  plat = "cpu" if args.dry_run else "cuda,cpu"
  me = [py, os.path.join(HERE, "device_check.py")]
  out = {
      "kernels": ([*me, "--step=kernels", f"--size={size}",
                   f"--out={work}/kernels.json"], plat),
      "tests_interpret": ([py, "-m", "pytest", "-q", "tests/test_attention_kernels.py"], "cpu"),
      "tests_gpu": ([py, "-m", "pytest", "-q", "-rs", "tests/test_gpu_device.py"], plat),
      "main": ([py, "-m", "dapo_jax.main", f"--config={main_cfg}",
                f"--workdir={work}/main"], plat),
      "update": ([*me, "--step=jax_bench", "bench_update.py", f"--model={model}", *update,
                  f"--json={work}/update.json"], plat),
      "rl_step": ([*me, "--step=jax_bench", "bench_rl_step.py", f"--model={model}", *rl,
                   f"--json={work}/rl_step.json"], plat),
  }
  if args.peer_python:
    dev = "--device=cpu" if args.dry_run else "--device=cuda"
    out["torch_update"] = ([args.peer_python, os.path.join(HERE, "peers/torch_update.py"),
                            f"--model={model}", *update[:2], dev,
                            f"--json={work}/torch_update.json"], "cpu")
    out["trl_step"] = ([args.peer_python, os.path.join(HERE, "peers/trl_step.py"),
                        f"--model={model}", *rl, dev, f"--json={work}/trl_step.json"], "cpu")
  return out


def summarize(work: str, runs: dict, args) -> dict:
  """The JSON: every step's status, and the figures of those that wrote any."""
  size, _, rl, main_cfg = SIZES["dry" if args.dry_run else "gpu"]
  rl_args = dict(a[2:].split("=") for a in rl)
  gen_tokens = int(rl_args["prompts"]) * int(rl_args["group"]) * int(rl_args["new"])
  fig = {k: read_json(os.path.join(work, f"{k}.json"))
         for k in ("kernels", "update", "rl_step", "torch_update", "trl_step")}
  pick = lambda r, *keys: r and {k: r.get(k) for k in keys}
  for k in ("rl_step", "trl_step"):
    if fig[k]:
      fig[k]["gen_tok_per_s"] = gen_tokens / fig[k]["step_s"]
  return dict(
      date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), dry_run=args.dry_run,
      host=common.host(), model=dict(size=size, **common.MODELS[size]), steps=runs,
      kernels=fig["kernels"], main=dict(config=main_cfg, **runs.get("main", {}),
                                         results=evals(read_json(f"{work}/main/results.json"))),
      update={"dapo_jax": pick(fig["update"], "tok_per_s", "update_s", "logprob_tok_per_s",
                               "peak_bytes", "peak_rss_bytes", "platform", "setting"),
              "torch": pick(fig["torch_update"], "tok_per_s", "update_s", "peak_bytes",
                            "device")},
      rl_step={"dapo_jax": pick(fig["rl_step"], "step_s", "step_s_range", "gen_tok_per_s",
                                "phases", "peak_bytes", "peak_rss_bytes", "platform"),
               "trl": pick(fig["trl_step"], "step_s", "step_s_range", "gen_tok_per_s", "phases",
                           "peak_bytes")},
      peers="run" if args.peer_python else "not run (no --peer_python)")


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--dry_run", action="store_true", help="CPU, small sizes")
  ap.add_argument("--workdir", default="/tmp/dapo_jax_device_check")
  ap.add_argument("--out", help="the JSON (default: WORKDIR/device_check.json)")
  ap.add_argument("--peer_python", help="python of a venv with requirements-bench.txt")
  ap.add_argument("--peer_ready", help="a file the peers' venv install writes its exit code "
                  "to (device_check.sh installs it meanwhile): the peers wait for it")
  ap.add_argument("--step", choices=("kernels", "jax_bench"), help=argparse.SUPPRESS)
  ap.add_argument("--size", default="tiny", help=argparse.SUPPRESS)
  args, rest = ap.parse_known_args()
  if args.step == "kernels":
    common.write_json(args.out, kernels_step(args.size))
    return 0
  if args.step == "jax_bench":
    jax_bench_step(rest[0], rest[1:])
    return 0
  if rest:
    ap.error(f"unknown arguments {rest}")
  # This process only writes the model, on CPU: a JAX process on a GPU holds most of its
  # memory, which the steps need.
  os.environ["JAX_PLATFORMS"] = "cpu"
  work = os.path.abspath(args.workdir)
  os.makedirs(work, exist_ok=True)
  t0 = time.perf_counter()
  size = SIZES["dry" if args.dry_run else "gpu"][0]
  if not os.path.exists(os.path.join(work, size, "config.json")):
    common.make_model_dir(size, os.path.join(work, size))
  runs = {}
  for name, (cmd, plat) in steps(args, work).items():
    if name in PEERS and not peers_ready(args.peer_ready):
      runs[name] = dict(rc=1, tail=[f"the peers' venv failed to install ({args.peer_ready})"])
      continue
    runs[name] = run(name, cmd, dict(os.environ, JAX_PLATFORMS=plat), work)
  result = summarize(work, runs, args)
  result["wall_s"] = round(time.perf_counter() - t0, 1)
  common.write_json(args.out or os.path.join(work, "device_check.json"), result)
  return int(any(r["rc"] for r in runs.values()))


if __name__ == "__main__":
  sys.exit(main())
