"""The launcher's Cloud TPU path, checked field by field without a cloud: the fit check first
and by default, the queued resource, the workers' set-up, xpk, gs:// workdirs kept as URLs,
and a sweep's per-run states on a pod (finished, preempted -> resumed next launch)."""
import json
import os
import shlex
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "experiments"))
import launch_detached  # noqa: E402  pylint: disable=wrong-import-position
import launch  # noqa: E402  pylint: disable=wrong-import-position
import launch_pod  # noqa: E402  pylint: disable=wrong-import-position

POD = ["--backend=tpu-pod", "--tpu_name=mypod", "--zone=us-east5-a"]
CFG32 = "--config=configs/dapo_qwen25_32b.py"


def _lines(capsys):
  out = capsys.readouterr()
  return out.out.strip().splitlines(), out.err.strip().splitlines()


def _refused(capsys, argv):
  with pytest.raises(SystemExit) as e:
    launch.main(argv)
  assert e.value.code == 2
  return _lines(capsys)[1][-1]


def test_the_readme_dry_run_refuses_without_a_slice_to_check(capsys):
  last = _refused(capsys, [CFG32, *POD, "--workdir=gs://bucket/dapo32b", "--dry_run"])
  assert last.startswith("error: --backend=tpu-pod: the fit check needs the slice") and \
      "--accelerator_type" in last and "--skip_fit_check" in last, last


def test_slice_names():
  assert launch_pod.topology_of("v5p-128") == "v5p-128"
  assert launch_pod.topology_of("v5litepod-16") == "v5e-16"  # gcloud's name vs the AOT table's
  assert launch_pod.runtime_version("v5p-128") == "v2-alpha-tpuv5"
  assert launch_pod.runtime_version("v6e-64", "my-image") == "my-image"
  with pytest.raises(ValueError, match="--accelerator_type=v9-8"):
    launch_pod.topology_of("v9-8")


@pytest.mark.parametrize("extra,message", [
    (["--accelerator_type=v5p-128", "--topology=v5p-256"], "name different slices"),
    (["--queued_resource", "--skip_fit_check"], "--queued_resource needs --accelerator_type"),
    (["--skip_fit_check", "--workdir=runs/rel"], "a pod's runs need a bucket"),
])
def test_pod_flag_refusals(capsys, extra, message):
  workdir = [] if any(a.startswith("--workdir") for a in extra) else ["--workdir=gs://b/x"]
  last = _refused(capsys, [CFG32, *POD, *workdir, *extra, "--dry_run"])
  assert last.startswith("error: ") and message in last, last


def test_xpk_needs_a_cluster(capsys):
  last = _refused(capsys, [CFG32, "--backend=xpk", "--workdir=gs://b/x", "--skip_fit_check"])
  assert "--backend=xpk needs --cluster and --accelerator_type" in last


def _fake_subprocess(monkeypatch, misfit=None):
  """subprocess.run: the AOT check answers (rc 1 for `misfit`), git runs for real."""
  real, calls = subprocess.run, []

  def run(cmd, **kwargs):
    if cmd[0] == "git":
      return real(cmd, **kwargs)
    calls.append(cmd)
    rc = 1 if misfit and any(misfit in c for c in cmd) else 0
    return subprocess.CompletedProcess(cmd, rc, stdout="step peak per chip: 60 GiB", stderr="")

  monkeypatch.setattr(subprocess, "run", run)
  return calls


def test_dry_run_checks_the_fit_first_then_lists_every_command(capsys, monkeypatch):
  calls = _fake_subprocess(monkeypatch)
  assert launch.main([CFG32, *POD, "--workdir=gs://bucket/dapo32b", "--dry_run",
                      "--accelerator_type=v5p-128", "--queued_resource", "--capacity=spot",
                      "--setup"]) == 0
  out, err = _lines(capsys)
  assert len(calls) == 1 and calls[0][1:4] == ["-m", "dapo_jax.aot", CFG32]
  assert "--topology=v5p-128" in calls[0]
  assert out[0].startswith("[aot] run: ") and "step peak per chip" in out[1]
  cmds = [shlex.split(line) for line in out[2:]]
  assert [c[:5] for c in cmds] == [
      ["gcloud", "compute", "tpus", "queued-resources", "create"],
      ["gcloud", "compute", "tpus", "queued-resources", "describe"],
      ["git", "-C", launch.REPO, "archive", "--format=tar.gz"],
      ["gcloud", "compute", "tpus", "tpu-vm", "scp"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"],
      ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]]
  run_cmd = cmds[-1]
  assert run_cmd[5:8] == ["mypod", "--zone=us-east5-a", "--worker=all"]
  inner = shlex.split(run_cmd[8].removeprefix("--command="))
  # detached: its own session, its own log per worker, the set-up's Python, this launch's id
  assert inner[:7] == ["mkdir", "-p", "~/dapo_jax-logs", "&&", "cd", "~/dapo_jax", "&&"]
  assert inner[7].startswith("DAPO_LAUNCH_ID=") and inner[8:10] == ["nohup", "setsid"]
  assert inner[10:15] == ["~/dapo_jax-venv/bin/python", "-m", "dapo_jax.main",
                          "--config=configs/dapo_qwen25_32b.py",
                          "--workdir=gs://bucket/dapo32b/run"]  # the URL, never a local path
  assert inner[15:] == [">", "~/dapo_jax-logs/run.$(hostname).log", "2>&1", "<", "/dev/null",
                        "&"]
  assert any("a dry run does not read gs://bucket/dapo32b" in line for line in err)


def test_misfit_refuses_before_any_command(capsys, monkeypatch):
  _fake_subprocess(monkeypatch, misfit="dapo_qwen25_32b")
  last = _refused(capsys, [CFG32, *POD, "--workdir=gs://b/x", "--dry_run",
                           "--accelerator_type=v5p-128"])
  assert last.startswith("error: --topology=v5p-128: run do(es) not fit"), last
  assert not any(line.startswith("gcloud") for line in _lines(capsys)[0])


@pytest.mark.parametrize("capacity,flag", [("spot", ["--spot"]), ("reserved", ["--reserved"]),
                                           ("on-demand", [])])
def test_queued_resource_commands(capacity, flag):
  pod = launch_pod.Pod("mypod", "us-east5-a", project="proj")
  cmd = launch_pod.queued_resource_create(pod, accelerator_type="v5p-128",
                                          runtime="v2-alpha-tpuv5", capacity=capacity)
  assert cmd == ["gcloud", "compute", "tpus", "queued-resources", "create", "mypod",
                 "--zone=us-east5-a", "--project=proj", "--node-id=mypod",
                 "--accelerator-type=v5p-128", "--runtime-version=v2-alpha-tpuv5", *flag]
  assert launch_pod.queued_resource_state(pod) == [
      "gcloud", "compute", "tpus", "queued-resources", "describe", "mypod", "--zone=us-east5-a",
      "--project=proj", "--format=value(state.state)"]


def test_queued_resource_is_awaited_until_active(monkeypatch, capsys):
  states = iter(["", "WAITING_FOR_RESOURCES", "PROVISIONING", "ACTIVE"])
  ran = []
  monkeypatch.setattr(launch, "QR_POLL_S", 0.0)
  monkeypatch.setattr(launch, "_state", lambda cmd: next(states))
  monkeypatch.setattr(launch, "_run", lambda cmd, dry, capture=False: ran.append(cmd) or "")
  args = launch.parse([CFG32, *POD, "--workdir=gs://b/x", "--accelerator_type=v5p-128",
                       "--queued_resource", "--skip_fit_check"])
  launch.get_slice(args, launch_pod.Pod("mypod", "us-east5-a"))
  assert len(ran) == 1 and ran[0][3:6] == ["queued-resources", "create", "mypod"]
  assert capsys.readouterr().out.count("[slice] mypod: ") == 3
  states = iter(["ACTIVE"])  # there already: nothing is created
  ran.clear()
  launch.get_slice(args, launch_pod.Pod("mypod", "us-east5-a"))
  assert ran == []
  states = iter(["SUSPENDED", "ACTIVE"])  # the slice was preempted: asked for again
  launch.get_slice(args, launch_pod.Pod("mypod", "us-east5-a"))
  assert [c[3:6] for c in ran] == [["queued-resources", "delete", "mypod"],
                                   ["queued-resources", "create", "mypod"]]
  assert ran[0][-2:] == ["--force", "--quiet"]
  states = iter(["", "FAILED"])
  with pytest.raises(ValueError, match="queued resource mypod is FAILED .*rerun the launch"):
    launch.get_slice(args, launch_pod.Pod("mypod", "us-east5-a"))


def test_setup_commands_ship_the_commit_idempotently():
  pod = launch_pod.Pod("mypod", "z", repo_dir="~/dapo_jax")
  sha = "0123456789abcdef" * 2 + "01234567"
  archive, scp, ssh = launch_pod.setup_commands(pod, sha)
  tar = "/tmp/dapo_jax-0123456789ab.tar.gz"
  assert archive == ["git", "-C", launch.REPO, "archive", "--format=tar.gz", f"--output={tar}",
                     sha]
  assert scp == ["gcloud", "compute", "tpus", "tpu-vm", "scp", tar, f"mypod:{tar}", "--zone=z",
                 "--worker=all"]
  assert ssh[:8] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "mypod", "--zone=z",
                     "--worker=all"]
  script = ssh[8].removeprefix("--command=")
  # Replaced only when the worker's tree is another commit; pip then finds everything there.
  assert f'if [ "$(cat ~/dapo_jax/.commit 2>/dev/null)" != {sha} ]; then' in script
  assert f"tar -xzf {tar} -C ~/dapo_jax.new" in script and f"echo {sha} >" in script
  assert "python3 -m uv venv --quiet --seed --python 3.11 ~/dapo_jax-venv" in script
  assert script.endswith("~/dapo_jax-venv/bin/python -m pip install --quiet -r "
                         "~/dapo_jax/requirements-tpu.txt")


def test_setup_script_is_idempotent_in_a_shell(tmp_path):
  """The worker-side script run twice in a fake home: the tree is replaced once, then kept."""
  home = tmp_path / "home"
  home.mkdir()
  sha = subprocess.run(["git", "-C", launch.REPO, "rev-parse", "HEAD"], capture_output=True,
                       text=True, check=True).stdout.strip()
  pod = launch_pod.Pod("p", "z", repo_dir=str(home / "dapo_jax"))
  archive, _, ssh = launch_pod.setup_commands(pod, sha)
  subprocess.run(archive, check=True)
  script = ssh[8].removeprefix("--command=").replace("bin/python -m pip install", "bin/echo pip")
  script = script.replace("-venv/bin/echo", "-venv/bin/python -c pass; echo")
  for _ in range(2):
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
    assert "pip --quiet -r" in out.stdout
  assert (home / "dapo_jax" / ".commit").read_text().strip() == sha
  assert (home / "dapo_jax" / "requirements.txt").is_file()
  (home / "dapo_jax" / "marker").write_text("kept")  # a second run leaves the tree alone
  subprocess.run(["bash", "-c", script], capture_output=True, check=True)
  assert (home / "dapo_jax" / "marker").exists()
  assert (home / "dapo_jax-venv" / "bin" / "python").exists()  # this host's python3 is 3.11


def test_setup_script_refuses_a_worker_without_python_311(tmp_path):
  """A TPU VM image's python3 3.10, and no uv to be had: one `error:` line naming the worker."""
  fake = tmp_path / "bin"
  fake.mkdir()
  (fake / "python3").write_text("#!/bin/sh\n[ \"$1\" = -V ] && echo 'Python 3.10.12'\nexit 1\n")
  (fake / "python3").chmod(0o755)
  pod = launch_pod.Pod("p", "z", repo_dir=str(tmp_path / "dapo_jax"))
  script = launch_pod.setup_commands(pod, "0" * 40)[2][8].removeprefix("--command=")
  script = script.split("fi; ", 1)[1]  # the tree is not the point here
  out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=False,
                       env=dict(os.environ, PATH=f"{fake}:/usr/bin:/bin"))
  assert out.returncode == 1
  last = out.stderr.strip().splitlines()[-1]
  assert last.startswith("error: no Python >= 3.11 on worker ") and "Python 3.10.12" in last


def test_xpk_command_fields(capsys):
  assert launch.main(["--config=configs/ladder.py", "--sweep=eps_high", "--backend=xpk",
                      "--cluster=c1", "--accelerator_type=v5p-128", "--zone=us-east5-a",
                      "--project=proj", "--workdir=gs://b/sweep", "--skip_fit_check",
                      "--only=eps_high0.36_s0", "--dry_run"]) == 0
  (line,) = [ln for ln in _lines(capsys)[0] if ln.startswith("xpk")]
  cmd = shlex.split(line)
  assert cmd[:3] == ["xpk", "workload", "create"]
  flags = dict((a + "=").split("=", 1) if "=" not in a else a.split("=", 1) for a in cmd[3:])
  assert flags == {
      "--cluster": "c1", "--workload": "ladder-eps-high0-36-s0", "--tpu-type": "v5p-128",
      "--num-slices": "1", "--base-docker-image": "python:3.11", "--script-dir": launch.REPO,
      "--max-restarts": "3", "--restart-on-user-code-failure": "",  # the exit 75 after a save
      "--termination-grace-period-seconds": "3600", "--command": flags["--command"],
      "--zone": "us-east5-a", "--project": "proj"}
  inner = shlex.split(flags["--command"])
  assert inner[:7] == ["python3", "-m", "pip", "install", "--quiet", "-r",
                       "requirements-tpu.txt"]
  assert inner[7] == "&&" and inner[8:11] == ["python3", "-m", "dapo_jax.main"]
  assert "--workdir=gs://b/sweep/eps_high0.36_s0" in inner and inner[-1] == "--resume"
  assert "--config.algo.eps_high=0.36" in inner


def test_workload_names_follow_xpk_rules():
  name = lambda config, run: launch_pod.workload_name(  # noqa: E731
      launch.RunSpec(run, config, {}, "gs://b/x"))
  assert name("configs/ladder.py:base=tiny", "eps_high0.36_s0") == "ladder-eps-high0-36-s0"
  assert name("configs/dapo_qwen25_32b.py", "run") == "dapo-qwen25-32b-run"
  assert name("configs/0x.py", "run") == "r-0x-run"
  assert len(name("configs/ladder.py", "x" * 60)) == 40


def _finish(workdir, steps):
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.json"), "w", encoding="utf-8") as f:
    json.dump({"steps": steps, "before": {"avg@4": 0.25}, "after": {"avg@4": 0.5}}, f)


def test_a_pod_sweep_reports_each_run_and_resumes_the_preempted_one(tmp_path, monkeypatch,
                                                                    capsys):
  """Three runs on one slice, each started detached and followed through its workdir: the
  first finishes, the second saves after a SIGTERM (state.json says so), the third is not
  started; the next launch skips the first and resumes the second."""
  seen = []

  def fake_start(cmd, dry, capture=False):  # the run as the workers would leave its workdir
    del dry, capture
    inner = shlex.split(cmd[-1].removeprefix("--command="))
    seen.append(inner)
    wd = next(a for a in inner if a.startswith("--workdir=")).split("=", 1)[1]
    launch_id = next(a for a in inner if a.startswith("DAPO_LAUNCH_ID=")).split("=", 1)[1]
    if wd.endswith("_s0"):
      _finish(wd, 20)
      return ""
    os.makedirs(os.path.join(wd, "checkpoints", "5"), exist_ok=True)
    with open(os.path.join(wd, "state.json"), "w", encoding="utf-8") as f:
      json.dump({"state": "preempted", "signal": "SIGTERM", "step": 5, "launch": launch_id}, f)
    return ""

  monkeypatch.setattr(launch, "_run", fake_start)
  monkeypatch.setattr(launch_detached, "POLL_S", 0.0)
  argv = ["--config=configs/ladder.py", "--sweep=eps_high", *POD, "--skip_fit_check",
          f"--workdir={tmp_path}", "--only=eps_high0.36_s0,eps_high0.36_s1,eps_high0.36_s2"]
  assert launch.main(argv) == 1
  out = capsys.readouterr().out
  rows = out.split("== summary ==")[1].strip().splitlines()
  assert [r.split()[:3] for r in rows] == [["eps_high0.36_s0", "finished", "steps"],
                                           ["eps_high0.36_s1", "preempted", "steps"],
                                           ["eps_high0.36_s2", "not", "started"]]
  assert "SIGTERM at step 5; rerun the same launch to resume it" in rows[1]
  assert "[pod] eps_high0.36_s1: preempted SIGTERM at step 5" in out
  assert len(seen) == 2 and "--resume" not in seen[1]
  seen.clear()
  assert launch.main(argv) == 1
  rows = capsys.readouterr().out.split("== summary ==")[1].strip().splitlines()
  assert [r.split()[1] for r in rows] == ["skipped", "preempted", "not"]
  assert len(seen) == 1 and "eps_high0.36_s1" in " ".join(seen[0]) and "--resume" in seen[0]
  # the state of every run, read back later from the workdir alone
  assert launch.main([*argv, "--action=status"]) == 1
  states = [r.split()[:2] for r in capsys.readouterr().out.strip().splitlines()]
  assert states == [["eps_high0.36_s0", "finished"], ["eps_high0.36_s1", "preempted"],
                    ["eps_high0.36_s2", "new"]]
