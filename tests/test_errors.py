"""One way to fail: each refusal a user can cause ends with one `error:` line naming the place
(the traceback in <workdir>/errors.log, or above the line with --debug); a quiet start."""
import errno
import json
import os
import re
import subprocess
import sys
import types

import pytest
from flax import nnx

from configs import tiny_cpu
from dapo_jax import config as config_lib
from dapo_jax import job
from dapo_jax import quiet, refusals
from dapo_jax.workdir import run_config
from dapo_jax.models import config as model_config_lib
from dapo_jax.models import qwen2

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.xdist_group("subprocess")  # starts `main` processes


def _main(workdir, *args, timeout=600):
  out = subprocess.run([sys.executable, "-m", "dapo_jax.main", f"--workdir={workdir}", *args],
                       cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False)
  assert out.returncode == 1, (out.returncode, out.stderr[-3000:])
  return out.stderr.strip().splitlines()[-1], out.stderr


@pytest.mark.parametrize("args,line", [
    (["--config=configs/tiny_cpu.py", "--config.algo.eps_high=-1"],
     "error: config.algo.eps_high: must be >= 0 for loss mode 'dapo', got -1.0"),
    (["--config=configs/tiny_cpu.py", "--config.algo.eps_hgh=1"],
     "error: --config.algo.eps_hgh: no such config field (did you mean 'eps_high'?)"),
    (["--config=configs/nope.py"], "error: --config: no such file configs/nope.py"),
    (["--config=configs/tiny_cpu.py:bogus=1"],
     "error: flag --config=configs/tiny_cpu.py:bogus=1: Error whilst parsing config file: "
     "ValueError: config arg: unknown option 'bogus'"),
    (["--config=configs/tiny_cpu.py", "--config.train.batch_size=abc"],
     "error: flag --config.train.batch_size=abc: "),
])
def test_config_refusals(tmp_path, args, line):
  last, stderr = _main(tmp_path / "run", *args, timeout=120)
  assert last.startswith(line), last
  assert "Traceback" not in stderr


def test_debug_prints_the_traceback_above_the_line(tmp_path):
  last, stderr = _main(tmp_path / "run", "--config=configs/tiny_cpu.py",
                       "--config.algo.eps_high=-1", "--debug", timeout=120)
  assert last.startswith("error: config.algo.eps_high") and "Traceback" in stderr


def test_a_changed_seed_on_resume_names_the_seed(tmp_path):
  cfg = config_lib.parse(tiny_cpu.get_config("runlocal=True"))
  meta = tmp_path / "checkpoints" / "4" / "meta"
  meta.mkdir(parents=True)
  (meta / "metadata").write_text(json.dumps({"config": run_config.as_record(cfg)}))
  last, _ = _main(tmp_path, "--config=configs/tiny_cpu.py:runlocal=True", "--config.seed=1",
                  "--resume")
  assert re.match(rf"error: config: --resume of {tmp_path} changes fields its checkpoint "
                  r"\(step 4\) was trained with: seed 0 -> 1\. ", last), last
  assert "ValueError" in (tmp_path / "errors.log").read_text()


def test_a_bad_data_row_names_the_file_and_row(tmp_path):
  data = tmp_path / "data"
  data.mkdir()
  (data / "aime24_qwen25math.jsonl").write_text(
      '{"id": 0, "problem": "p", "answer": 3}\n{"id": 1, "problem": "q"}\n')
  last, _ = _main(tmp_path / "run", "--config=configs/tiny_cpu.py:runlocal=True",
                  "--config.task.eval_name=aime_2024", f"--config.task.data_dir={data}")
  assert last == (f"error: {data}/aime24_qwen25math.jsonl: line 2: missing answer (fix or "
                  f"remove the row; skip_bad=True, in a run config.task.skip_bad=True, skips "
                  f"and counts bad rows)"), last


@pytest.mark.parametrize("exc,line", [
    (OSError(errno.ENOSPC, "No space left on device", "/w/metrics.jsonl"),
     "error: /w/metrics.jsonl: No space left on device. Free space there (or use another "
     "--workdir) and rerun with --resume"),
    (PermissionError(errno.EACCES, "Permission denied", "/w"),
     "error: /w: Permission denied. Make it writable, or use another --workdir"),
    (FileNotFoundError("/d/x.parquet: no such data file (set config.task.data_dir, ...)"),
     "error: /d/x.parquet: no such data file (set config.task.data_dir, ...)"),
    (ValueError("config.rollout.top_p: must be in (0, 1], got 2"),
     "error: config.rollout.top_p: must be in (0, 1], got 2 (set it in the config file or "
     "with --config.<field>=...)"),
    (refusals.Refusal("export of the trained policy to /w/export failed: ..."),
     "error: export of the trained policy to /w/export failed: ..."),
])
def test_error_lines(exc, line):
  assert refusals.error_line(exc) == line


def test_a_bug_keeps_its_traceback():
  assert refusals.error_line(KeyError("x")) is None
  assert refusals.error_line(AssertionError("x")) is None


def _tiny_run(tmp_path):
  """Just what `export` reads of a run: a 1-layer model, its config, a tokenizer, a step."""
  from dapo_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  mcfg = model_config_lib.ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64,
                                      num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
  graphdef, params = nnx.split(qwen2.Qwen2(mcfg, rngs=nnx.Rngs(0)))
  ns = types.SimpleNamespace
  return ns(model=ns(graphdef=graphdef, model_config=mcfg, frozen=None),
            loop=ns(state=ns(params=params), step=3),
            task=ns(tokenizer=tokenizer_lib.load_tokenizer()))


def test_a_failed_export_names_the_directory(tmp_path, monkeypatch):
  run = _tiny_run(tmp_path)
  job.export(run, str(tmp_path / "ok"))  # the same run exports where it can
  assert (tmp_path / "ok" / "model.safetensors").is_file()
  blocked = tmp_path / "blocked"
  blocked.write_text("a file where the export goes")
  with pytest.raises(refusals.Refusal) as e:
    job.export(run, str(blocked))
  assert refusals.error_line(e.value).startswith(
      f"error: export of the trained policy to {blocked} failed: ")
  import safetensors.numpy  # pylint: disable=import-outside-toplevel
  from safetensors import SafetensorError  # pylint: disable=import-outside-toplevel

  def full_disk(*args, **kwargs):
    raise SafetensorError('Error while serializing: I/O error: No space left on device (os '
                          'error 28)')

  monkeypatch.setattr(safetensors.numpy, "save_file", full_disk)
  with pytest.raises(refusals.Refusal) as e:
    job.export(run, str(tmp_path / "full"))
  assert refusals.error_line(e.value) == (
      f"error: export of the trained policy to {tmp_path}/full failed: Error while serializing: "
      f"I/O error: No space left on device (os error 28). The run's last checkpoint (step 3) "
      f"is intact: fix the cause (free space there) and rerun with --resume to export again")


def test_filtered_stderr_drops_only_the_notices(capfd):
  with quiet.filtered_stderr():
    os.write(2, b"WARNING: All log messages before absl::InitializeLog() is called are written "
                b"to STDERR\nI0000 00:00:1 1 cudart_stub.cc:31] Could not find cuda drivers on "
                b"your machine, GPU will not be used.\nE0000 cuda_executor.cc:1228] INTERNAL: "
                b"CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)\nsomething a user "
                b"needs\n")
  assert capfd.readouterr().err == "something a user needs\n"


def test_tensorflow_starts_quietly():
  code = ("from dapo_jax import quiet; quiet.import_tensorflow(); import tensorflow; "
          "import sys; print('imported', file=sys.stderr)")
  loud = subprocess.run([sys.executable, "-c", "import tensorflow"], cwd=REPO,
                        capture_output=True, text=True, timeout=300, check=False)
  if not any(quiet.is_notice(line) for line in loud.stderr.splitlines()):
    pytest.skip("TensorFlow prints no start-up notice on this machine")
  calm = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                        timeout=300, check=False)
  assert calm.stderr.strip().splitlines() == ["imported"], calm.stderr


def test_a_failed_start_on_a_full_disk_leaves_no_probe(tmp_path, monkeypatch):
  """The write probe's file is created, then the disk is full: the refusal names the
  directory and the empty probe is gone (it used to stay)."""
  from etils.epath import gpath  # pylint: disable=import-outside-toplevel
  from dapo_jax.train import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel

  def full(self, data, *args, **kwargs):
    with self.open("w") as f:
      f.write("")
    raise OSError(errno.ENOSPC, "No space left on device", os.fspath(self))

  monkeypatch.setattr(gpath.PosixGPath, "write_text", full)
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), keep=1, async_save=False)
  assert refusals.error_line(e.value) == (
      f"error: cannot use checkpoint directory {tmp_path}/checkpoints: [Errno 28] No space "
      f"left on device: '{tmp_path}/checkpoints/.write_probe'")
  assert os.listdir(tmp_path / "checkpoints") == []
