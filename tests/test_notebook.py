"""CI executes the ablation notebook on the committed sweep logs: no cell may error, every
verdict line must be one of the three verdicts, and each verdict must be what the committed logs
say, recomputed here from the raw files (not through dapo_jax.analysis)."""
import json
import math
import os
import re

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTEBOOK = os.path.join(REPO, "notebooks", "ablations.ipynb")
RESULTS = os.path.join(REPO, "experiments", "results")
VERDICT_LINE = re.compile(r"^    (\S+) − (\S+) on (\S+): .* -> (\S+)$")
# Two-sided 95 % Student-t quantiles from a printed table (df -> t), for the oracle below.
T_TABLE = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306,
           9: 2.262}


def _execute(tmp_path):
  nb = nbformat.read(NOTEBOOK, as_version=4)
  env = dict(DAPO_RESULTS=RESULTS, PYTHONPATH=REPO,
             DAPO_VERDICTS=str(tmp_path / "verdicts.json"))
  client = NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": str(tmp_path)}})
  old = dict(os.environ)
  os.environ.update(env)
  try:
    client.execute()
  finally:
    os.environ.clear()
    os.environ.update(old)
  return nb


def _raw_value(run_dir, metric, tail):
  """The claim's per-seed number straight from the files: the final eval's metric, or the mean
  of a train metric over the last third (34 %, rounded) of the logged steps."""
  if not tail:
    with open(os.path.join(run_dir, "results.json"), encoding="utf-8") as f:
      return float(json.load(f)["after"][metric])
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    recs = sorted((json.loads(ln) for ln in f), key=lambda r: r["step"])
  v = [r[metric] for r in recs if r["kind"] == "train" and isinstance(r.get(metric), float)]
  k = max(1, int(round(0.34 * len(v))))
  return float(np.mean(v[-k:]))


def _oracle(a, b, metric, expected):
  tail = not metric.startswith(("avg@", "pass@", "maj@"))
  seeds = sorted(int(n.rsplit("_s", 1)[1]) for n in os.listdir(os.path.join(RESULTS, "ladder"))
                 if n.rsplit("_s", 1)[0] == a)
  d = np.array([_raw_value(os.path.join(RESULTS, "ladder", f"{a}_s{s}"), metric, tail)
                - _raw_value(os.path.join(RESULTS, "ladder", f"{b}_s{s}"), metric, tail)
                for s in seeds])
  half = T_TABLE[len(d) - 1] * d.std(ddof=1) / math.sqrt(len(d))
  lo, hi = d.mean() - half, d.mean() + half
  sign = 1 if expected == "higher" else -1
  if sign * lo > 0 and sign * hi > 0:
    return d.mean(), "reproduced"
  if sign * lo < 0 and sign * hi < 0:
    return d.mean(), "refuted"
  return d.mean(), "inconclusive"


@pytest.mark.skipif(not os.path.isdir(os.path.join(RESULTS, "ladder")),
                    reason="no committed ladder logs")
def test_ablations_notebook_verdicts_match_the_logs(tmp_path):
  nb = _execute(tmp_path)
  text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
  assert "ladder runs" in text
  lines = [m.groups() for m in map(VERDICT_LINE.match, text.splitlines()) if m]
  assert len(lines) == 9, f"expected 9 claims, got {len(lines)}"
  rows = json.loads((tmp_path / "verdicts.json").read_text())
  assert [(r["a"], r["b"], r["metric"], r["verdict"]) for r in rows] == lines
  for r in rows:
    assert r["verdict"] in ("reproduced", "refuted", "inconclusive"), r
    expected = "lower" if "restrains" in r["claim"] else "higher"
    diff, want = _oracle(r["a"], r["b"], r["metric"], expected)
    assert r["diff"] == pytest.approx(diff, abs=1e-9), r["claim"]
    assert r["verdict"] == want, r["claim"]
  figures = sum(o.get("output_type") == "display_data" for c in nb.cells
                for o in c.get("outputs", []))
  assert figures >= 6, f"expected the ladder, Fig. 2-5, Fig. 7 and sweep figures, got {figures}"
