import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position


def test_expand_ladder_sweep(tmp_path):
  runs = launch.expand("configs/ladder.py", "ladder", str(tmp_path))
  assert len(runs) == 30 and runs[0].name == "naive_grpo_s0"
  assert runs[0].config_arg == "configs/ladder.py:rung=naive_grpo,seed=0"
  eps = launch.expand("configs/ladder.py", "eps_high", str(tmp_path))
  assert "--config.algo.eps_high=0.44" in eps[-1].argv()
  single = launch.expand("configs/tiny_cpu.py", None, str(tmp_path))
  assert [r.name for r in single] == ["run"]
  with pytest.raises(ValueError, match="get_sweep"):
    launch.expand("configs/tiny_cpu.py", "ladder", str(tmp_path))


def test_status_skip_and_resume(tmp_path):
  run = launch.expand("configs/ladder.py", "ladder", str(tmp_path))[0]
  assert run.status() == "new" and "--resume" not in run.argv()
  os.makedirs(os.path.join(run.workdir, "checkpoints", "4"))
  assert run.status() == "resumable" and run.argv()[-1] == "--resume"
  with open(os.path.join(run.workdir, "results.json"), "w", encoding="utf-8") as f:
    f.write('{"steps": 12, "after": {"avg@16": 0.5}, "before": {"avg@16": 0.25}}')
  assert run.status() == "finished"
  row = launch.summary_row(run, launch.Outcome("skipped", "finished before"))
  assert "before   25.0" in row and "avg@16 50.0" in row and "steps    12" in row
  assert row.split()[1] == "skipped" and row.endswith("finished before")


def test_dry_runs_print_exact_commands(tmp_path, capsys):
  assert launch.main(["--config=configs/dapo_qwen25_32b.py", "--backend=tpu-pod",
                      "--tpu_name=pod", "--zone=z", f"--workdir={tmp_path}", "--dry_run",
                      "--skip_fit_check"]) == 0
  out = capsys.readouterr().out.strip().splitlines()
  assert len(out) == 1 and out[0].startswith("gcloud compute tpus tpu-vm ssh pod --zone=z")
  assert "--worker=all" in out[0] and "dapo_jax.main --config=configs/dapo_qwen25_32b.py" in out[0]
  assert launch.main(["--config=configs/ladder.py", "--sweep=l_cache", "--backend=multihost",
                      f"--workdir={tmp_path}", "--dry_run", "--only=lcache0.500_s0"]) == 0
  out = capsys.readouterr().out.strip().splitlines()
  assert len(out) == 2 and all("--config.distributed.enabled=True" in l for l in out)
  assert "--config.distributed.process_id=1" in out[1]
  assert launch.main(["--config=configs/ladder.py", "--sweep=eps_high", f"--workdir={tmp_path}",
                      "--dry_run", "--only=eps_high0.44_s0", "--set=algo.eps_high=0.1",
                      "--set=checkpoint.export_hf=False"]) == 0
  out = capsys.readouterr().out
  assert "--config.algo.eps_high=0.44" in out and "--config.checkpoint.export_hf=False" in out
  assert "eps_high=0.1" not in out


@pytest.mark.parametrize("args,message", [
    (["--backend=tpu-pod"], "--backend=tpu-pod needs --tpu_name and --zone"),
    (["--only=nope"], "--only: unknown run names ['nope']"),
    (["--sweep=bogus"], "unknown sweep"),
    (["--parallel=0"], "--parallel: must be >= 1"),
    (["--backend=nope"], "argument --backend: invalid choice"),
])
def test_bad_arguments_end_with_one_error_line(tmp_path, capsys, args, message):
  with pytest.raises(SystemExit) as e:
    launch.main(["--config=configs/ladder.py", f"--workdir={tmp_path}", *args])
  assert e.value.code == 2
  last = capsys.readouterr().err.strip().splitlines()[-1]
  assert last.startswith("error: ") and message in last, last
