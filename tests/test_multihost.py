"""2 processes x 4 CPU devices (jax.distributed, gloo) give the step metrics of 1 x 8."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position

# Starts processes of its own (real signals, deadlines): under `pytest -n 2` these modules share
# one worker (--dist loadgroup), so two of them never compete for the 2 cores.
pytestmark = pytest.mark.xdist_group("subprocess")

OVERRIDES = {
    "train.num_steps": 2, "train.batch_size": 4, "train.num_minibatches": 2,
    "algo.dynamic_sampling": False,
    "rollout.group_size": 4, "rollout.num_slots": 16, "eval.num_problems": 4,
    "eval.num_samples": 2, "eval.bootstrap_samples": 10, "log.tensorboard": False,
    "log.progress": False, "checkpoint.export_hf": False,
    # A learning rate at which step 2's rollouts depend on step 1's update (so a host whose
    # sampler missed the weight sync would diverge).
    "optim.lr": 3e-2, "optim.warmup_steps": 0,
}
VOLATILE = ("time_", "tokens_per_s")
# The sampler-vs-trainer |dlogp| percentiles measure float32 round-off itself (both sides are
# float32 here: ~1e-5 nats), so another reduction order moves them by as much as their value.
ROUNDOFF, ROUNDOFF_ABS = ("mismatch_abs_",), 5e-4


def _records(workdir):
  with open(os.path.join(workdir, "metrics.jsonl"), encoding="utf-8") as f:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VOLATILE)}
            for line in f]


def _run(cmds, workdir, timeout=600):
  procs = [subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for argv, env in cmds]
  outs = [p.communicate(timeout=timeout)[0] for p in procs]
  # Every process's exit and its last lines before any C++ stack trace (which fills a tail).
  assert [p.returncode for p in procs] == [0] * len(procs), "\n".join(
      f"process {i} exited {p.returncode}: {out.split('*** Check failure')[0][-1500:]}"
      for i, (p, out) in enumerate(zip(procs, outs)))
  return _records(workdir)


def test_prompt_offset_aligns_host_slices():
  from dapo_jax.models.qwen2 import ModelConfig, Qwen2  # pylint: disable=import-outside-toplevel
  from dapo_jax.rollout.sampler import make_sampler  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=1,
                    num_heads=2, num_kv_heads=1, head_dim=16)
  s = make_sampler(Qwen2(cfg, rngs=nnx.Rngs(0)), num_slots=8, max_prompt_len=8, max_len=16)
  prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9], [10]]
  kw = dict(group_size=2, max_new_tokens=6, seed=3)
  whole = s.sample_groups(prompts, **kw)
  tail = s.sample_groups(prompts[2:], prompt_offset=2, **kw)
  np.testing.assert_array_equal(whole.tokens[2:], tail.tokens)
  with pytest.raises(ValueError, match="prompt_offset"):
    s.sample_groups(prompts, prompt_offset=-1, **kw)


def test_two_processes_equal_one(tmp_path):
  def spec(name):
    return launch.RunSpec(name, "configs/tiny_cpu.py", dict(OVERRIDES), str(tmp_path / name))
  one_spec = spec("one")
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8",
             JAX_PLATFORMS="cpu")
  one = _run([(one_spec.argv(), env)], one_spec.workdir)
  two_spec = spec("two")
  two = _run(launch.multihost_commands(two_spec, 2, 4), two_spec.workdir)
  assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2, 2]
  for a, b in zip(one, two):
    assert a.keys() == b.keys()
    for k in a:
      if isinstance(a[k], float):
        # Cross-process reductions add in another order: equal to float32 round-off.
        tol = ROUNDOFF_ABS if k.startswith(ROUNDOFF) else 1e-6
        assert b[k] == pytest.approx(a[k], rel=1e-4, abs=tol), (a["step"], k)
      else:
        assert a[k] == b[k], (a["step"], k)


def test_two_processes_split_placement_with_staleness(tmp_path):
  """2 processes x 4 devices, each giving 2 to its sampler and 2 to the trainer: the weight
  sync crosses from the trainer's devices to the sampler's on every host (a collective every
  process enters at the same round boundary) and no token trains more than 1 version late."""
  over = dict(OVERRIDES, **{"rollout.placement": "split", "rollout.sampler_devices": 4.0,
                            "rollout.max_staleness": 1, "rollout.partial": True,
                            "algo.is_correction": "tis_token", "train.num_steps": 3})
  spec = launch.RunSpec("split", "configs/tiny_cpu.py", over, str(tmp_path / "split"))
  recs = [r for r in _run(launch.multihost_commands(spec, 2, 4), spec.workdir)
          if r["kind"] == "train"]
  assert [r["step"] for r in recs] == [1, 2, 3]
  assert all(r["staleness_max"] <= 1.0 and np.isfinite(r["loss"]) for r in recs)
  assert recs[0]["staleness_max"] == 0.0  # the first batch: sampled before any update


def test_watchdog_quiet_after_shutdown(monkeypatch):
  """After jax.distributed.shutdown (at exit) the peer watchdog must not ask JAX for the process
  count: that starts a new CPU backend against the closed coordinator and aborts the process
  (exit -6 after a finished 2-process run, 2026-12-03)."""
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel
  from dapo_jax import distributed  # pylint: disable=import-outside-toplevel
  monkeypatch.setattr(jax_distributed.global_state, "client", None)
  monkeypatch.setattr(distributed.jax, "process_count", lambda: pytest.fail("process_count"))
  assert distributed.lost_processes() == []


_LATE_PEER = """
import sys, time
from dapo_jax import distributed
from dapo_jax.config.sections import DistributedCfg
pid, port, late_s, wait_s = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
distributed.initialize(DistributedCfg(True, "localhost:" + port, 2, pid, "gloo"))
time.sleep(late_s * pid)  # process 1 ends its job late_s after process 0
distributed.finish(wait_s=wait_s)
print("finished", pid)
"""


def _finish_apart(late_s: float, wait_s: float) -> list[tuple[int, str]]:
  port = str(launch.local_backend._free_port())  # pylint: disable=protected-access
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  procs = [subprocess.Popen([sys.executable, "-c", _LATE_PEER, str(i), port, str(late_s),
                             str(wait_s)], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  return [(p.returncode, out) for p, out in ((p, p.communicate(timeout=120)[0]) for p in procs)]


def test_processes_finishing_apart_both_exit_zero():
  """Recoverability makes JAX's shutdown barrier wait for no one: without `finish`, process 0
  stops the coordination service and a peer still finishing aborts (-6, 2026-12-07)."""
  got = _finish_apart(late_s=3, wait_s=60)
  assert [rc for rc, _ in got] == [0, 0], [out[-1500:] for _, out in got]
  assert [f"finished {i}" in out for i, (_, out) in enumerate(got)] == [True, True]


def test_a_peer_that_never_finishes_is_named_not_waited_on_forever():
  (rc, out), _ = _finish_apart(late_s=8, wait_s=2)
  assert rc == 1, out[-1500:]
  assert ("error: process 0 of 2 finished its job, but not every process reached the end "
          "within 2 s") in out
