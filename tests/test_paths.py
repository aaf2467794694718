"""The path layer: a URL is never made local, and a run whose workdir is a bucket (a fake gs://
bucket, tests/fake_bucket.py) saves, resumes bitwise and writes its logs and results there."""
import json
import os
import signal

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_jax import job
from dapo_jax import metrics as metrics_lib
from dapo_jax.workdir import paths
from dapo_jax.data import readers
from dapo_jax.train import checkpoint as ckpt_lib
from dapo_jax.train import trainer
from tests import compile_cache, fake_bucket
from tests.test_faults import _flip, _state
from tests.test_trainer import fake_rewards, tiny_config  # noqa: F401  (autouse fixture)

pytestmark = pytest.mark.xdist_group("subprocess")  # real SIGTERM (as test_faults_trainer)
VOLATILE = ("time_", "tokens_per_s")


@pytest.fixture
def bucket(tmp_path, monkeypatch):
  """(root of the fake gs:// bucket files, the empty working directory the test runs in)."""
  root, cwd = tmp_path / "bucket", tmp_path / "cwd"
  root.mkdir()
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  fake_bucket.install(monkeypatch, root)
  yield root, cwd
  assert os.listdir(cwd) == [], "a gs:// path was made local"


def test_urls_stay_urls_and_local_paths_become_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert paths.as_str("gs://b/x/run") == "gs://b/x/run"
  assert paths.as_str(paths.resolve("gs://b/x") / "run") == "gs://b/x/run"
  assert paths.as_str("runs/a") == f"{tmp_path}/runs/a"
  assert paths.is_url("gs://b") and not paths.is_url("/gs/b")
  assert paths.free_bytes("gs://b/x") is None and paths.free_bytes(tmp_path) > 0


def test_files_in_a_bucket(bucket):
  root, _ = bucket
  paths.write_text("gs://b/d/a.json", '{"a": 1}')
  paths.append_text("gs://b/d/log.txt", "one\n")
  paths.append_text("gs://b/d/log.txt", "two\n")  # an object store has no append: rewritten
  assert (root / "b/d/log.txt").read_text() == "one\ntwo\n"
  assert paths.relative_files("gs://b/d") == ["a.json", "log.txt"]
  local = paths.copy_to_local("gs://b/d", ["a.json", "missing.json"])
  assert sorted(os.listdir(local)) == ["a.json"]
  with paths.staged_dir("gs://b/out") as tmp:
    with open(os.path.join(tmp, "w.txt"), "w", encoding="utf-8") as f:
      f.write("x")
  assert (root / "b/out/w.txt").read_text() == "x" and not os.path.exists(tmp)
  paths.move_tree("gs://b/out", "gs://b/moved")
  assert not (root / "b/out").exists() and (root / "b/moved/w.txt").is_file()


def test_checkpoints_in_a_bucket_save_verify_restore_and_fall_back(bucket):
  root, _ = bucket
  ck = ckpt_lib.Checkpointer("gs://b/run/checkpoints", keep=3, async_save=True)
  for s in (1, 2):
    ck.save(s, _state(float(s)), {"step": s})
  ck.wait()
  step2 = root / "b/run/checkpoints/2"
  # Committed in place with orbax's commit file, the manifest written before it.
  assert {"commit_success.txt", ckpt_lib.MANIFEST} <= set(os.listdir(step2))
  assert ckpt_lib.verify("gs://b/run/checkpoints/2") is None
  files = [os.path.join(r, f) for r, _, fs in os.walk(step2) for f in fs
           if f not in (ckpt_lib.MANIFEST, "commit_success.txt", "_CHECKPOINT_METADATA")]
  _flip(max(files, key=os.path.getsize))
  step, state, meta = ck.restore_latest(_state(0.0))
  assert step == 1 and meta == {"step": 1} and float(state["w"][0]) == 1.0
  assert (root / "b/run/corrupt_checkpoints/2").is_dir() and ck.steps() == [1]
  ck.close()


def test_metrics_and_tensorboard_in_a_bucket(bucket):
  root, _ = bucket
  w = metrics_lib.MetricWriter("gs://b/run", tensorboard=True, progress=False, total_steps=3,
                               keep_records=0)
  for step in (1, 2, 3):
    w.write(step, {"loss": float(step)})
  w.close()
  w = metrics_lib.MetricWriter("gs://b/run", tensorboard=True, progress=False, total_steps=3,
                               keep_records=2)  # resumed from a checkpoint after record 2
  w.write(3, {"loss": 3.5})
  w.close()
  recs = [json.loads(x) for x in (root / "b/run/metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["loss"]) for r in recs] == [(1, 1.0), (2, 2.0), (3, 3.5)]
  events = os.listdir(root / "b/run/tensorboard")
  assert events and all(e.startswith("events.out.tfevents.") for e in events)


def test_data_files_from_a_bucket(bucket):
  root, _ = bucket
  (root / "b/data").mkdir(parents=True)
  (root / "b/data/aime24_qwen25math.jsonl").write_text(
      '{"id": 0, "problem": "p", "answer": 3}\n\n{"id": 1, "problem": "q", "answer": 4}\n')
  examples, report = readers.load_examples("aime_2024", data_dir="gs://b/data")
  assert [e.answer for e in examples] == ["3", "4"] and report.blank == 1
  table = pa.table({"prompt": [[{"content": "p1", "role": "user"}]],
                    "reward_model": [{"ground_truth": "7", "style": "rule"}],
                    "extra_info": [{"index": 0, "split": "train"}]})
  pq.write_table(table, root / "b/data/dapo_math_17k_svs.parquet")
  examples, _ = readers.load_examples("dapo_math_17k", data_dir="gs://b/data")
  assert [(e.problem, e.answer) for e in examples] == [("p1", "7")]


def _records(text):
  return [{k: v for k, v in json.loads(x).items() if not k.startswith(VOLATILE)}
          for x in text.splitlines()]


def _cfg():
  # max_prompt_len 64 < the task's 66-70 prompt tokens: every prompt is cut, and counted.
  return tiny_config(**{"checkpoint.every_steps": 1, "log.tensorboard": True,
                        "task.max_prompt_len": 64})


def test_a_run_in_a_bucket_resumes_bitwise(tmp_path, monkeypatch, bucket):
  """A tiny run with a gs:// workdir, SIGTERMed during step 1, then resumed: its parameters,
  metrics and results equal an uninterrupted local run's; every file is in the bucket."""
  root, _ = bucket
  with compile_cache.persistent_cache(tmp_path / "jax_cache"):
    ref, ref_results = job.run_job(_cfg(), str(tmp_path / "ref"), resume=False,
                                        config_json="{}")
    step_fn = trainer.rollout_step

    def step_then_sigterm(run, *args, **kwargs):
      out = step_fn(run, *args, **kwargs)
      if run.loop.step == 0:
        os.kill(os.getpid(), signal.SIGTERM)
      return out

    monkeypatch.setattr(trainer, "rollout_step", step_then_sigterm)
    _, first = job.run_job(_cfg(), "gs://b/run", resume=False, config_json="{}")
    assert first["preempted"] and first["steps"] == 1
    monkeypatch.setattr(trainer, "rollout_step", step_fn)
    run, results = job.run_job(_cfg(), "gs://b/run", resume=True, config_json="{}")
  for a, b in zip(jax.tree.leaves(ref.loop.state), jax.tree.leaves(run.loop.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  wd = root / "b/run"
  assert results == ref_results
  assert json.loads((wd / "results.json").read_text()) == json.loads(
      (tmp_path / "ref/results.json").read_text())
  assert _records((wd / "metrics.jsonl").read_text()) == _records(
      (tmp_path / "ref/metrics.jsonl").read_text())
  assert sorted(os.listdir(wd / "checkpoints")) == ["1", "2"]
  train = [r for r in _records((wd / "metrics.jsonl").read_text()) if r["kind"] == "train"]
  assert all(r["prompts_truncated"] == r["prompts_sampled"] > 0 for r in train)
  assert results["before"]["prompts_truncated"] == results["after"]["prompts_truncated"] == 4
  assert len(os.listdir(wd / "tensorboard")) == 2  # one event file per start
  history = (wd / "config.history.jsonl").read_text().splitlines()
  assert [json.loads(h)["resumed_from_step"] for h in history] == [None, 1]


def test_load_pretrained_from_a_bucket_reads_each_row_once(bucket, monkeypatch, cpu_devices):
  """The shipped tiny base in a bucket loads bitwise equal to the local one onto an 8-device
  mesh; each tensor's bytes are read once in all, in one block of rows per device."""
  import shutil  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from dapo_jax import sharding  # pylint: disable=import-outside-toplevel
  from dapo_jax.workdir import remote_safetensors
  from dapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  root, _ = bucket
  local = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "dapo_jax", "assets", "tiny_base")
  shutil.copytree(local, root / "b" / "tiny_base")
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, cpu_devices)
  reads = []
  read_rows = remote_safetensors.LazyTensor.read_rows

  def counted(self, lo, hi):
    out = read_rows(self, lo, hi)
    reads.append((self.hf_shape, lo, hi, out.nbytes))
    return out

  monkeypatch.setattr(remote_safetensors.LazyTensor, "read_rows", counted)
  remote, rcfg = hf_io.load_pretrained("gs://b/tiny_base", mesh=mesh)
  want, wcfg = hf_io.load_pretrained(local, mesh=mesh)
  assert rcfg == wcfg
  for (path, a), (_, b) in zip(nnx.to_flat_state(nnx.state(remote)),
                               nnx.to_flat_state(nnx.state(want))):
    np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), path)
    assert a.get_value().sharding == b.get_value().sharding, path
  # Every byte once in all (no host-wide whole-tensor reads), and a tensor whose rows split
  # over the 8 devices is read as 8 blocks of rows, one per device.
  params = jax.tree.leaves(nnx.state(want))
  assert sum(r[3] for r in reads) == sum(x.size * x.dtype.itemsize for x in params)
  split = [(shape, lo, hi) for shape, lo, hi, _ in reads if hi - lo < shape[0]]
  assert split and all(hi - lo == shape[0] // 8 for shape, lo, hi in split)
