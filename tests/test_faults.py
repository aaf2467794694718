"""Checkpoint and log faults injected one at a time: damaged steps, a save that cannot fit, a full
disk during a save, and a metrics log cut back to its checkpoint."""
import gc
import json
import os
import struct
import subprocess
import time

import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax import metrics as metrics_lib
from dapo_jax.train import checkpoint as ckpt_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def _finalize_abandoned_reads():
  """Collects at each test's end what a refused restore leaves behind.

  A restore that fails part-way leaves orbax's unfinished read coroutines for the garbage
  collector. Left alone, their finalizers ran during a later test's lazy `import gguf` in the
  same worker, and CPython 3.11's import lock table broke (`KeyError` in `_ModuleLock`): a test
  that had nothing to do with checkpoints failed once in CI."""
  yield
  gc.collect()


class _Usage:
  def __init__(self, free):
    self.free = free


def _state(value: float, n: int = 4096):
  return {"w": jnp.full((n,), value, jnp.float32), "b": jnp.arange(8, dtype=jnp.float32),
          "count": jnp.int32(3)}


def _saved(directory, steps=(1, 2, 3), keep=3):
  ck = ckpt_lib.Checkpointer(str(directory), keep=keep, async_save=True)
  for s in steps:
    ck.save(s, _state(float(s)), {"step": s})
  ck.wait()
  return ck


def _biggest_file(step_dir):
  files = [os.path.join(r, f) for r, _, fs in os.walk(step_dir) for f in fs
           if f != ckpt_lib.MANIFEST]
  return max(files, key=os.path.getsize)


def _flip(path, n=64):
  with open(path, "r+b") as f:
    data = bytearray(f.read())
    mid = len(data) // 2
    data[mid:mid + n] = bytes(b ^ 0xFF for b in data[mid:mid + n])
    f.seek(0)
    f.write(data)


def test_every_committed_step_carries_a_manifest(tmp_path):
  ck = _saved(tmp_path / "ck")
  assert ck.steps() == [1, 2, 3]
  for s in ck.steps():
    assert ckpt_lib.verify(str(tmp_path / "ck" / str(s))) is None
  step, state, meta = ck.restore_latest(_state(0.0))
  assert step == 3 and meta == {"step": 3} and float(state["w"][0]) == 3.0


@pytest.mark.parametrize("damage,reason", [
    ("flip", "does not match its sha256"), ("truncate", "bytes"),
    ("delete_metadata", "state/_METADATA is missing"), ("no_manifest", "never completed")])
def test_damaged_newest_step_falls_back_to_the_previous(tmp_path, capsys, damage, reason):
  ck = _saved(tmp_path / "ck")
  step3 = str(tmp_path / "ck" / "3")
  if damage == "flip":  # same size, different bytes: only the checksum sees it
    _flip(_biggest_file(step3))
  elif damage == "truncate":
    path = _biggest_file(step3)
    os.truncate(path, os.path.getsize(path) // 2)
  elif damage == "delete_metadata":
    os.remove(os.path.join(step3, "state", "_METADATA"))
  else:  # killed after orbax's commit and before the manifest
    os.remove(os.path.join(step3, ckpt_lib.MANIFEST))
  step, state, _ = ck.restore_latest(_state(0.0))
  out = capsys.readouterr().out
  assert step == 2 and float(state["w"][0]) == 2.0
  assert f"step 3 ({step3}) is unusable" in out and reason in out, out
  assert os.path.isdir(tmp_path / "corrupt_checkpoints" / "3") and ck.steps() == [1, 2]
  ck.save(3, _state(3.0), {"step": 3})  # the step can be saved again
  ck.close()


def test_non_finite_checkpoint_is_rejected(tmp_path, capsys):
  ck = _saved(tmp_path / "ck", steps=(1,))
  ck.save(2, _state(float("nan")), {"step": 2})
  ck.wait()
  step, _, _ = ck.restore_latest(_state(0.0))
  assert step == 1 and "non-finite values" in capsys.readouterr().out


def test_no_good_checkpoint_says_what_to_delete(tmp_path):
  ck = _saved(tmp_path / "ck", steps=(1, 2))
  for s in (1, 2):
    _flip(_biggest_file(str(tmp_path / "ck" / str(s))))
  with pytest.raises(ckpt_lib.CheckpointError, match=r"no usable checkpoint .*steps \[1, 2\].*"
                     r"Delete .*ck and rerun"):
    ck.restore_latest(_state(0.0))
  assert ck.steps() == [1, 2]  # nothing moved: the user decides


def test_intact_checkpoint_of_another_shape_is_not_called_corrupt(tmp_path):
  ck = _saved(tmp_path / "ck", steps=(1,))
  with pytest.raises(ckpt_lib.CheckpointError, match="intact .*config.*change"):
    ck.restore_latest(_state(0.0, n=100))
  assert ck.steps() == [1]


def test_save_larger_than_free_space_stops_at_once(tmp_path, monkeypatch):
  ck = _saved(tmp_path / "ck", steps=(1,))
  monkeypatch.setattr(ckpt_lib.paths.shutil, "disk_usage", lambda path: _Usage(free=1000))
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"step 2 to .*ck: needs about 16,.* bytes, 1,000 free.*step 1"):
    ck.save(2, _state(2.0), {"step": 2})
  assert ck.steps() == [1] and ckpt_lib.verify(str(tmp_path / "ck" / "1")) is None


@pytest.fixture
def small_disk(tmp_path):
  """A 3 MiB tmpfs (needs root and mount; skipped where the sandbox forbids it)."""
  path = tmp_path / "small"
  path.mkdir()
  if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(path)],
                    capture_output=True, check=False).returncode != 0:
    pytest.skip("cannot mount a tmpfs here (not root?)")
  yield path
  subprocess.run(["umount", str(path)], check=False)


def test_full_disk_during_a_save_stops_with_the_path(small_disk, monkeypatch):
  ck = _saved(small_disk / "ck", steps=(1,))
  # 4 MB of random floats (orbax compresses: constant arrays would fit) into a 3 MiB disk.
  big = {"w": jnp.asarray(np.random.default_rng(0).normal(size=1_000_000), jnp.float32)}
  with pytest.raises(ckpt_lib.CheckpointError, match=r"needs about 4,000,0.. bytes"):
    ck.save(2, big, {"step": 2})
  # Space that runs out while writing (another process filled the disk): the background
  # save's failure surfaces at the next poll, names the path, and leaves no temporary directory.
  monkeypatch.setattr(ckpt_lib.paths.shutil, "disk_usage", lambda path: _Usage(free=1 << 40))
  ck.save(2, big, {"step": 2})
  with pytest.raises(ckpt_lib.CheckpointError,
                     match=r"step 2 to .*small/ck failed: .*No space left on device.*step 1\) "
                           r"is intact"):
    deadline = time.time() + 60
    while time.time() < deadline:
      ck.poll()
      time.sleep(0.05)
  assert sorted(os.listdir(small_disk / "ck")) == ["1"]
  assert ckpt_lib.verify(str(small_disk / "ck" / "1")) is None


def _tb_purge_steps(logdir):
  """Steps of the SessionLog START events (TensorBoard's purge marks) in the event files."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  steps = []
  for name in sorted(os.listdir(logdir)):
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    i = 0
    while i < len(data):  # TFRecord: u64 length, u32 crc, payload, u32 crc
      (n,) = struct.unpack("<Q", data[i:i + 8])
      ev = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 16 + n
      if ev.HasField("session_log"):
        steps.append(ev.step)
  return steps


def test_metrics_log_is_cut_back_to_the_checkpoint(tmp_path, capsys):
  w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=True, progress=False, total_steps=5,
                               keep_records=0)
  w.write(0, {"acc": 0.1}, kind="eval")
  for step in (1, 2, 3):
    w.write(step, {"loss": float(step)})
  keep = w.records  # a checkpoint of step 3 is saved here
  w.write(4, {"loss": 4.0})
  w.write(5, {"loss": 5.0})
  w._f.write('{"step": 6, "kin')  # killed mid-line  # pylint: disable=protected-access
  w.close()
  w = metrics_lib.MetricWriter(str(tmp_path), tensorboard=True, progress=False, total_steps=5,
                               keep_records=keep)
  assert "kept 4 records, dropped 3 written after the restored checkpoint" in \
      capsys.readouterr().out
  w.write(4, {"loss": 4.5})
  w.close()
  with open(tmp_path / "metrics.jsonl", encoding="utf-8") as f:
    recs = [json.loads(line) for line in f]
  assert [r["step"] for r in recs] == [0, 1, 2, 3, 4] and recs[-1]["loss"] == 4.5
  # TensorBoard hides the old steps 4 and 5 (the event file of the first writer may have been
  # replaced: same pid and second, same file name).
  assert _tb_purge_steps(tmp_path / "tensorboard")[-1] == 4


def test_checkpoint_dirs_is_the_one_latest_step_answer(tmp_path):
  from dapo_jax.train import checkpoint_dirs  # pylint: disable=import-outside-toplevel
  d = tmp_path / "checkpoints"
  assert checkpoint_dirs.steps(str(d)) == [] and checkpoint_dirs.latest(str(d)) is None
  for name in ("2", "10", "7.orbax-checkpoint-tmp-1", "corrupt"):
    (d / name).mkdir(parents=True)
  (d / "3").write_text("a file, not a step directory")
  assert checkpoint_dirs.steps(str(d)) == [2, 10]
  assert checkpoint_dirs.latest(str(d)) == 10
