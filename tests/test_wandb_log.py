"""log.wandb: the scalars MetricWriter gives TensorBoard reach an offline wandb run at the same
steps; a second start in the workdir (a --resume) continues the same wandb run, also when the
workdir is a bucket; without wandb, log.wandb=True is refused in one `error:` line before
anything is built. Each offline run is read back from wandb's own .wandb file, not from the
writer."""
import glob
import json
import os
import struct
import subprocess
import sys
import time

import pytest

from dapo_jax import config as config_lib
from dapo_jax import metrics as metrics_lib
from dapo_jax import metrics_wandb
from tests import fake_bucket
from tests.test_config import REPO, _tiny

BLOCK = 32768  # bytes per block of the .wandb file's LevelDB-style log


@pytest.fixture
def offline(monkeypatch):
  pytest.importorskip("wandb")  # optional (requirements-dev.txt)
  monkeypatch.setenv("WANDB_MODE", "offline")


def _config(wandb: bool):
  c = _tiny("runlocal=True")
  c.log.wandb = wandb
  return config_lib.parse(c)


def _records(path: str) -> list:
  """The protobuf records of a .wandb file: a 7-byte header (":W&B", magic, version), then
  32 KiB blocks of (crc32c, length, type) + bytes, a record whole (type 1) or split across
  blocks (first 2, middle 3, last 4); a block's tail too short for a header is padding."""
  from wandb.proto import wandb_internal_pb2  # pylint: disable=import-outside-toplevel
  with open(path, "rb") as f:
    data = f.read()
  assert data[:4] == b":W&B", path
  out, pos, part = [], 7, b""
  while pos + 7 <= len(data):
    if BLOCK - pos % BLOCK < 7:
      pos += BLOCK - pos % BLOCK
      continue
    _, n, kind = struct.unpack("<IHB", data[pos:pos + 7])
    part, pos = part + data[pos + 7:pos + 7 + n], pos + 7 + n
    if kind in (1, 4):
      out.append(wandb_internal_pb2.Record.FromString(part))
      part = b""
  return out


def _offline_runs(wandb_dir) -> list[dict]:
  """Each offline run under `wandb_dir`: {"run": its RunRecord, "history": {step: {key: value}}}
  (wandb's own `_step`, `_runtime`, `_timestamp` left out). Waits for each run's exit record:
  wandb's service may write the file's tail after `finish()` returns."""
  runs = []
  for path in glob.glob(os.path.join(wandb_dir, "offline-run-*", "*.wandb")):
    deadline = time.time() + 30
    while not any(r.HasField("exit") for r in _records(path)) and time.time() < deadline:
      time.sleep(0.1)
    recs = _records(path)
    history = {}
    for r in recs:
      if r.HasField("history"):
        items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
        history[r.history.step.num] = {k: v for k, v in items.items() if not k.startswith("_")}
    runs.append({"run": next(r.run for r in recs if r.HasField("run")), "history": history})
  return runs


def test_offline_run_holds_the_tensorboard_scalars_of_every_step(tmp_path, offline):
  cfg = _config(True)
  workdir = tmp_path / "my_run"
  writer, _ = metrics_lib.loggers(cfg, str(workdir), keep_records=0, first_length=None)
  writer.write(0, {"avg@4": 0.25, "shown": [{"pred": "3"}], "tag": "before"}, kind="eval")
  for step in (1, 2):
    writer.write(step, {"loss": 0.5 / step, "entropy": 1.0 + step, "warnings": []})
  writer.write(2, {"avg@4": 0.5, "tag": "after"}, kind="eval")
  writer.close()
  (run,) = _offline_runs(workdir / "wandb")
  assert run["history"] == {0: {"eval/avg_at_4": 0.25},
                            1: {"train/loss": 0.5, "train/entropy": 2.0},
                            2: {"train/loss": 0.25, "train/entropy": 3.0, "eval/avg_at_4": 0.5}}
  rec = run["run"]
  assert rec.run_id == (workdir / metrics_wandb.ID_FILE).read_text().strip()
  assert (rec.project, rec.display_name) == ("dapo_jax", "my_run")
  config = {u.key: json.loads(u.value_json) for u in rec.config.update}
  assert config["algo"]["eps_high"] == cfg.algo.eps_high


def test_a_second_start_continues_the_run_in_a_bucket_workdir(tmp_path, monkeypatch, offline):
  root, cwd, local = tmp_path / "bucket", tmp_path / "cwd", tmp_path / "local"
  for d in (root, cwd, local):
    d.mkdir()
  monkeypatch.chdir(cwd)
  monkeypatch.setattr("tempfile.tempdir", str(local))  # wandb's own files for a gs:// workdir
  fake_bucket.install(monkeypatch, root)
  opts = {"project": "p", "entity": "", "name": "", "config": {"seed": 1}}
  for keep, steps in ((0, (1, 2, 3)), (2, (3, 4))):  # resumed from a checkpoint after step 2
    w = metrics_lib.MetricWriter("gs://b/run", tensorboard=False, progress=False,
                                 total_steps=4, keep_records=keep, wandb=opts)
    for step in steps:
      w.write(step, {"loss": float(step)})
    w.close()
  runs = [r for d in glob.glob(str(local / "dapo_jax_wandb_*" / "wandb"))
          for r in _offline_runs(d)]
  assert sorted(sorted(r["history"]) for r in runs) == [[1, 2, 3], [3, 4]]
  run_id = (root / "b/run" / metrics_wandb.ID_FILE).read_text().strip()
  assert {(r["run"].run_id, r["run"].display_name) for r in runs} == {(run_id, "run")}
  assert os.listdir(cwd) == [], "a gs:// path was made local"


def test_log_wandb_without_wandb_is_refused_in_one_line(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
  with pytest.raises(ValueError, match=r"^config\.log\.wandb: .*pip install wandb") as e:
    _config(True)
  assert "\n" not in str(e.value)
  assert not config_lib.parse(_tiny("runlocal=True")).log.wandb  # off by default
  code = ("import runpy, sys; sys.modules['wandb'] = None; "
          "runpy.run_module('dapo_jax.main', run_name='__main__')")
  workdir = tmp_path / "run"
  p = subprocess.run([sys.executable, "-c", code, "--config=configs/tiny_cpu.py:runlocal=True",
                      f"--workdir={workdir}", "--config.log.wandb=True"], cwd=REPO,
                     env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                     timeout=300)
  last = p.stderr.strip().splitlines()[-1]
  assert p.returncode == 1 and last.startswith("error: config.log.wandb: "), p.stderr[-2000:]
  assert "pip install wandb" in last
  assert not workdir.exists()  # refused before anything was built or written
