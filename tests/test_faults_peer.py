"""A dead peer: SIGKILL one of 2 processes mid-run; the other must exit non-zero within 60 s with a
last line naming the lost process, and the last checkpoint must still restore."""
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from dapo_jax.train import checkpoint as ckpt_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position
from tests.test_multihost import OVERRIDES  # noqa: E402  pylint: disable=wrong-import-position

# Starts processes of its own (real signals, deadlines): under `pytest -n 2` these modules share
# one worker (--dist loadgroup), so two of them never compete for the 2 cores.
pytestmark = pytest.mark.xdist_group("subprocess")


def _start(workdir, logdir):
  spec = launch.RunSpec("peer", "configs/tiny_cpu.py",
                        dict(OVERRIDES, **{"train.num_steps": 8, "checkpoint.every_steps": 1}),
                        str(workdir))
  logs = [open(logdir / f"p{i}.log", "w", encoding="utf-8") for i in range(2)]  # pylint: disable=consider-using-with
  return [subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
          for (argv, env), log in zip(launch.multihost_commands(spec, 2, 4), logs)]


def test_survivor_names_the_dead_peer_and_the_checkpoint_restores(tmp_path):
  procs = _start(tmp_path / "run", tmp_path)
  ckpts = tmp_path / "run" / "checkpoints"
  try:
    deadline = time.time() + 900
    while not (ckpts / "1").is_dir():  # mid-run: step 1 committed, step 2 under way
      assert time.time() < deadline and all(p.poll() is None for p in procs), \
          (tmp_path / "p0.log").read_text()[-3000:]
      time.sleep(0.2)
    procs[1].send_signal(signal.SIGKILL)
    t_kill = time.time()
    rc = procs[0].wait(timeout=120)
    took = time.time() - t_kill
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  last = (tmp_path / "p0.log").read_text().strip().splitlines()[-1]
  print(f"survivor exited {took:.1f} s after the kill: {last}")
  assert rc != 0 and took <= 60, (rc, took, last)
  assert "lost process(es) [1]" in last and last.startswith("error: process 0 of 2"), last
  step = max(int(d) for d in os.listdir(ckpts) if d.isdigit())
  assert ckpt_lib.verify(str(ckpts / str(step))) is None
  path = str(ckpts / str(step) / "state")  # as host arrays: the saving devices are gone
  ck = ocp.PyTreeCheckpointer()
  args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray),
                      ck.metadata(path).item_metadata.tree)
  state = ck.restore(path, restore_args=args)
  assert int(np.asarray(state["updates"])) == 2 * step  # 2 updates per step
