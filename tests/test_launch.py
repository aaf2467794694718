import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position
import launch_local  # noqa: E402  pylint: disable=wrong-import-position
import launch_runs  # noqa: E402  pylint: disable=wrong-import-position


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


def test_a_registered_campaign_is_a_sweep_in_its_registered_order(tmp_path):
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  from dapo_jax.analysis import confirm  # pylint: disable=g-import-not-at-top
  reg = confirm.load_registration(
      os.path.join(root, "experiments", "preregistration", "testbed_confirm.json"))
  runs = launch.expand("configs/ladder.py", "testbed_confirm", str(tmp_path))
  assert [r.name for r in runs] == reg.run_names()  # seed-major: a cut-short campaign pairs
  assert runs[0].config_arg == "configs/ladder.py:rung=soft_overlong,seed=100,base=testbed"
  assert "--config.checkpoint.export_hf=False" in runs[0].argv()


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


def test_rerun_says_how_many_it_skipped(tmp_path, capsys):
  runs = launch.expand("configs/ladder.py", "ladder", str(tmp_path))
  for run in runs[:2]:  # two finished, one interrupted, 27 new
    os.makedirs(run.workdir)
    with open(os.path.join(run.workdir, "results.json"), "w", encoding="utf-8") as f:
      f.write('{"steps": 30}')
  os.makedirs(os.path.join(runs[2].workdir, "checkpoints", "10"))
  assert launch.main(["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={tmp_path}",
                      "--dry_run"]) == 0
  out, err = capsys.readouterr()
  assert "[launch] skipped 2 finished run(s)" in err and "28 to run, 1 of them resumed" in err
  assert len(out.strip().splitlines()) == 28  # the commands of the runs left, nothing else


def _finish(run, *, big=False):
  os.makedirs(os.path.join(run.workdir, "checkpoints", "30"))
  for name, text in (("metrics.jsonl", '{"step": 1}\n'), ("config.json", "{}"),
                     ("results.json", '{"steps": 30}')):
    with open(os.path.join(run.workdir, name), "w", encoding="utf-8") as f:
      f.write(text)
  if big:
    with open(os.path.join(run.workdir, "big.bin"), "wb") as f:
      f.write(b"0" * (launch_runs.SMALL_LOG_BYTES + 1))


def test_results_dir_skips_committed_runs_and_takes_finished_ones_logs(tmp_path, capsys):
  work, results = tmp_path / "work", tmp_path / "results"
  a, b = launch.expand("configs/ladder.py", "ladder", str(work))[:2]
  _finish(a, big=True)  # finished in the workdir, logs not yet copied
  os.makedirs(results / b.name)  # only in the results dir (a fresh clone's committed logs)
  (results / b.name / "results.json").write_text('{"steps": 30}')
  assert launch.main(["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={work}",
                      f"--results_dir={results}", f"--only={a.name},{b.name}"]) == 0
  assert sorted(os.listdir(results / a.name)) == ["config.json", "metrics.jsonl", "results.json"]
  assert "skipped 2 finished run(s)" in capsys.readouterr().out  # neither was started


def test_results_dir_keeps_a_failed_runs_logs_and_runs_it_again(tmp_path, capsys):
  work, results = tmp_path / "work", tmp_path / "results"
  run = launch.expand("configs/ladder.py", "ladder", str(work))[0]
  argv = ["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={work}",
          f"--results_dir={results}", f"--only={run.name}", "--set=train.num_steps=-1"]
  assert launch.main(argv) == 1  # refused by the config check: the run fails
  kept = sorted(os.listdir(results / run.name))
  assert "log.txt" in kept and "results.json" not in kept
  assert "config.train.num_steps" in (results / run.name / "log.txt").read_text()
  capsys.readouterr()
  assert launch.main(argv + ["--dry_run"]) == 0
  assert "1 to run" in capsys.readouterr().err  # not skipped: it never finished
  (results / run.name / "errors.log").write_text("the failed attempt's")
  _finish(run)  # a later attempt finishes: its logs replace the failed one's
  launch_runs.copy_small_logs(run, str(results))
  assert sorted(os.listdir(results / run.name)) == ["config.json", "log.txt", "metrics.jsonl",
                                                    "results.json"]


def test_stop_at_starts_no_run_that_cannot_finish(tmp_path, capsys):
  run = launch.expand("configs/ladder.py", "ladder", str(tmp_path))[0]
  assert launch.main(["--config=configs/ladder.py", "--sweep=ladder", f"--workdir={tmp_path}",
                      f"--only={run.name}", "--stop_at=+1", "--run_minutes=5"]) == 1
  out, err = capsys.readouterr()
  assert "1 run(s) not started" in err and "not started" in out
  assert not os.path.exists(run.workdir)  # nothing ran
  now = 1_000_000.0
  d = launch_local.deadline("+10", 4, now=now)
  assert d.allows(now, 0) and not d.allows(now + 7 * 60, 0) and not d.allows(now, 11 * 60)


@pytest.mark.parametrize("args,message", [
    (["--stop_at=12:00"], "--stop_at needs --run_minutes"),
    (["--stop_at=noon", "--run_minutes=3"], "--stop_at=noon: expected HH:MM"),
    (["--backend=xpk", "--cluster=c", "--accelerator_type=v5p-8", "--results_dir=r"],
     "--results_dir and --stop_at are for the local backends"),
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
