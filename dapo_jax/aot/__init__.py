"""Ahead-of-time check of a run on a TPU slice, compiled on this (CPU) machine with libtpu.

  JAX_PLATFORMS=cpu python -m dapo_jax.aot --config=configs/dapo_qwen25_32b.py \
      --topology=v5p-128 --json=/tmp/aot.json

Builds the run's shapes abstractly (no weights, no data), compiles every jitted function of a
rollout step for the slice's chips, and reports per-chip memory, the TPU cost model's FLOPs,
bytes and seconds, and whether the step fits in HBM (exit 1 when it does not).
"""
import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")  # libtpu must not probe for attached chips
# Compile-only use: several processes (a test beside a check) may load libtpu at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def check(cfg, topology_name: str, *, only=()) -> dict:
  """The report of `cfg` (a parsed Config) on a slice, as a JSON-able dict; `only` names a
  subset of the functions to compile (the verdict then covers that subset)."""
  from dapo_jax.aot import functions, report, topology  # pylint: disable=import-outside-toplevel
  sl = topology.parse(topology_name)
  devices = topology.devices(sl)
  plan = functions.build_plan(cfg, devices, hosts=sl.hosts, host_slice=topology.one_host(sl))
  names = [job.name for job in plan.jobs]
  unknown = sorted(set(only) - set(names))
  if unknown:
    raise ValueError(f"--functions: unknown {unknown}; known: {names}")
  plan.jobs = [job for job in plan.jobs if not only or job.name in only]
  rows = []
  for job in plan.jobs:  # one at a time, with progress: a 32B compile takes tens of seconds
    rows.append(report.compile_job(job))
    print(f"[aot] {job.name}: {rows[-1]['status']} in {rows[-1]['compile_s']:.0f}s, peak "
          f"{rows[-1]['peak_bytes'] / 2**30:.2f} GiB per chip", flush=True)
  summary = report.summarize(rows, plan.buffers, sl.hbm_bytes)
  if plan.info["placement"] == "split":  # each role's chips: their own functions and buffers
    sides = {side: report.summarize([r for r, j in zip(rows, plan.jobs) if j.side == side],
                                    plan.buffers, sl.hbm_bytes)
             for side in sorted({j.side for j in plan.jobs})}
    summary = dict(summary, sides=sides, fits=all(s["fits"] for s in sides.values()))
  kernels = sorted({k for r in rows for k in r.get("kernels", ())})
  return {"topology": sl.name, "chips": sl.chips, "hosts": sl.hosts, **summary, "kernels": kernels,
          "partial": len(plan.jobs) < len(names),
          "functions": rows, "resident_buffers": plan.buffers, **plan.info,
          "table": report.table(rows, summary, plan.buffers)}
