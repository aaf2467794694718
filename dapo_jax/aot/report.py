"""Compiles a Plan's jobs and turns the compiler's numbers into the per-chip report."""
import re
import time

from dapo_jax.aot.topology import GiB

_OOM = re.compile(r"\(([\d.]+)([KMGT])\) exceeds available")
# A Pallas TPU kernel is a Mosaic custom call; the instruction is named after the kernel.
_TPU_KERNEL = re.compile(r'%([\w.-]+) = [^\n]*custom_call_target="tpu_custom_call"'
                         r'(?:[^\n]*?op_name="([^"]*)")?')
_FAMILIES = (("splash", "splash_attention"), ("ragged_paged", "ragged_paged_attention"),
             ("paged", "paged_attention"), ("flash", "flash_attention"))
_UNITS = {"K": 1024, "M": 1024 ** 2, "G": GiB, "T": 1024 ** 4}


def _cost(compiled) -> dict:
  ca = compiled.cost_analysis()
  ca = ca[0] if isinstance(ca, (list, tuple)) else (ca or {})
  secs = float(ca.get("optimal_seconds", 0.0))
  # XLA's cost model gives some functions with Pallas kernels a negative optimal_seconds
  # (-1.98 for Qwen3-30B-A3B's log-prob pass on v5p-64): not a time, so None.
  return {"flops": float(ca.get("flops", 0.0)), "bytes_accessed": float(ca.get("bytes accessed", 0.0)),
          "cost_seconds": secs if secs >= 0 else None}


def _secs(x) -> str:
  return f"{'n/a':>9}" if x is None else f"{x:9.4f}"


def pallas_kernels(hlo_text: str) -> list:
  """The Pallas kernels a compiled TPU function calls (its `tpu_custom_call`s), by family
  (paged_attention, splash_attention, ...; another kernel by its own name)."""
  found = set()
  for m in _TPU_KERNEL.finditer(hlo_text):
    name = re.sub(r"\.\d+$", "", m.group(1))
    text = f"{name} {m.group(2) or ''}".lower()
    found.add(next((fam for key, fam in _FAMILIES if key in text), name))
  return sorted(found)


def compile_job(job) -> dict:
  """One row: per-chip bytes from memory_analysis(), FLOPs / bytes / seconds from the TPU cost
  model (while-loop bodies, e.g. the layer scan, counted once: see docs/scale.md)."""
  t0 = time.perf_counter()
  row = {"name": job.name, "resident": list(job.resident)}
  try:
    compiled = job.fn.lower(*job.args).compile()
  except Exception as err:  # pylint: disable=broad-except
    msg = str(err)
    if "RESOURCE_EXHAUSTED" not in msg:
      raise
    m = _OOM.search(msg)
    need = int(float(m.group(1)) * _UNITS[m.group(2)]) if m else 0
    row.update(status="out_of_memory", error=msg.splitlines()[0][:300], peak_bytes=need, kernels=[],
               temp_bytes=need, argument_bytes=0, output_bytes=0, alias_bytes=0, code_bytes=0,
               flops=0.0, bytes_accessed=0.0, cost_seconds=0.0)
    row["compile_s"] = time.perf_counter() - t0
    return row
  m = compiled.memory_analysis()
  row.update(status="compiled", argument_bytes=m.argument_size_in_bytes,
             output_bytes=m.output_size_in_bytes, alias_bytes=m.alias_size_in_bytes,
             temp_bytes=m.temp_size_in_bytes, code_bytes=m.generated_code_size_in_bytes)
  peak = getattr(m, "peak_memory_in_bytes", 0) or (
      m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
      + m.temp_size_in_bytes)
  row["peak_bytes"] = int(peak + m.generated_code_size_in_bytes)
  row.update(_cost(compiled))
  row["kernels"] = pallas_kernels(compiled.as_text() or "")
  row["compile_s"] = time.perf_counter() - t0
  return row


def step_peak(row: dict, buffers: dict) -> tuple[int, list]:
  """(the function's peak + the long-lived buffers beside it, its items largest first)."""
  items = [(f"{row['name']} temporaries", row["temp_bytes"]),
           (f"{row['name']} arguments", row["argument_bytes"]),
           (f"{row['name']} outputs (not aliased)", max(0, row["output_bytes"] - row["alias_bytes"])),
           (f"{row['name']} code", row["code_bytes"])]
  items += [(f"resident {b}", buffers.get(b, 0)) for b in row["resident"]]
  items = sorted([i for i in items if i[1] > 0], key=lambda i: -i[1])
  return row["peak_bytes"] + sum(buffers.get(b, 0) for b in row["resident"]), items


def summarize(rows: list, buffers: dict, hbm_bytes: int) -> dict:
  """Step peak (the largest function peak plus its resident buffers), the verdict and the
  three largest items of the worst function."""
  for row in rows:
    row["step_peak_bytes"], row["items"] = step_peak(row, buffers)
  worst = max(rows, key=lambda r: r["step_peak_bytes"])
  ok = all(r["status"] == "compiled" for r in rows) and worst["step_peak_bytes"] <= hbm_bytes
  return {"peak_bytes": worst["step_peak_bytes"], "peak_function": worst["name"],
          "hbm_bytes": hbm_bytes, "fits": ok,
          "largest_items": [{"name": n, "bytes": b} for n, b in worst["items"][:3]]}


def _g(b) -> str:
  return f"{b / GiB:8.2f}"


def table(rows: list, summary: dict, buffers: dict) -> str:
  """The printed report: one row per function, the resident buffers, the verdict."""
  head = (f"{'function':<24}{'arg GiB':>9}{'temp GiB':>9}{'out GiB':>9}{'code GiB':>9}"
          f"{'peak GiB':>9}{'+resid.':>9}{'GFLOP':>10}{'GB acc.':>9}{'cost s':>9}{'compile':>8}")
  lines = [head, "-" * len(head)]
  for r in rows:
    flag = "" if r["status"] == "compiled" else "  OUT OF MEMORY at compile"
    lines.append(f"{r['name']:<24}{_g(r['argument_bytes'])} {_g(r['temp_bytes'])} "
                 f"{_g(r['output_bytes'])} {_g(r['code_bytes'])} {_g(r['peak_bytes'])} "
                 f"{_g(r['step_peak_bytes'])}{r['flops'] / 1e9:10.1f}"
                 f"{r['bytes_accessed'] / 1e9:9.2f}{_secs(r['cost_seconds'])}"
                 f"{r['compile_s']:7.1f}s{flag}")
  used = [f"{r['name']}: {', '.join(r['kernels'])}" for r in rows if r.get("kernels")]
  lines.append("Pallas kernels: " + ("; ".join(used) or "none"))
  lines.append("resident buffers per chip (GiB): " + ", ".join(
      f"{k} {v / GiB:.2f}" for k, v in buffers.items() if v))
  for side, s in summary.get("sides", {"": summary}).items():
    lines += _verdict(s, f"{side} chips' " if side else "")
  return "\n".join(lines)


def _verdict(summary: dict, who: str) -> list:
  verdict = "fits" if summary["fits"] else "does not fit"
  lines = [f"{who}step peak per chip: {summary['peak_bytes'] / GiB:.2f} GiB "
           f"({summary['peak_function']}) of {summary['hbm_bytes'] / GiB:.0f} GiB HBM: {verdict}"]
  if not summary["fits"]:
    lines.append("largest items: " + "; ".join(
        f"{i['name']} {i['bytes'] / GiB:.2f} GiB" for i in summary["largest_items"]))
  return lines
