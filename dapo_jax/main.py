"""Runs one dapo_jax job: warm start (if configured), DAPO training, before/after evaluation.

  python -m dapo_jax.main --config=configs/tiny_cpu.py --workdir=runs/tiny
  python -m dapo_jax.main --config=configs/ladder.py:rung=naive_grpo --workdir=runs/naive
  python -m dapo_jax.main --config=configs/tiny_cpu.py --config.algo.eps_high=0.4 --workdir=...
  ... --workdir=gs://bucket/runs/tiny   # a bucket: checkpoints, logs and results go there
  ... --resume   # continue from the workdir's newest intact checkpoint
  ... --debug    # on a refusal, print the traceback above the error line

The workdir is the run's own: `run.lock` there names the holder, and a second run on it is
refused (dapo_jax.run_lock). A resume keeps the config the checkpoint was trained with; only the
fields in run_config.RESUMABLE may change, and each start is appended to config.history.jsonl
before config.json is replaced (dapo_jax.run_config). SIGTERM (a preemption notice), SIGINT
(Ctrl-C) and SIGHUP save a checkpoint at the end of the current step and exit with status 75
(run_state.PREEMPTED_EXIT: a job controller restarts it); `--resume` continues from it.
`<workdir>/state.json` records how the start ended (dapo_jax.run_state). Resuming
a run that finished does nothing. Every refusal a user can cause (a config value, a data row,
a resume that changes the experiment, a full disk, a failed save or export, a lost peer) ends
with exit status 1 and one `error: ...` line, last on stderr; the traceback goes to
<workdir>/errors.log, and above that line with --debug (dapo_jax.refusals).
"""
import dataclasses
import json
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

from dapo_jax import paths, quiet, refusals, run_state

flags.DEFINE_string("workdir", None, "Directory for metrics, checkpoints and the exported "
                    "policy: a local path or a bucket URL (gs://...).")
flags.DEFINE_bool("resume", False, "Continue from the latest checkpoint in --workdir.")
flags.DEFINE_bool("debug", False, "On a refusal, print the traceback above the error line.")
config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
flags.mark_flags_as_required(["config", "workdir"])
FLAGS = flags.FLAGS


@dataclasses.dataclass
class _Started:
  """How far the job got: the workdir (once known), its lock, whether JAX's processes are up."""
  workdir: str | None = None
  lock: object | None = None  # the run_lock.RunLock, once this process holds the workdir
  distributed: bool = False


def _fmt(e: dict, key: str) -> str:
  return f"{100 * e[key]:.1f}% [95% CI {100 * e[key + '_ci_lo']:.1f}, {100 * e[key + '_ci_hi']:.1f}]"


def _finished(workdir: str, num_steps: int) -> dict | None:
  """The results of a run in `workdir` that already did `num_steps` steps, else None."""
  path = paths.resolve(workdir) / "results.json"
  if not path.exists():
    return None
  try:
    results = json.loads(path.read_text())
    steps = results["steps"]
  except (ValueError, KeyError, TypeError) as e:
    raise refusals.Refusal(f"{path}: not a run's results ({refusals.one_line(repr(e))}); move "
                           f"it aside and rerun with --resume to finish the run again") from None
  return results if steps >= num_steps else None


def _hold(workdir: str):
  """Process 0 takes the workdir's lock; every process learns whether it did."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  from dapo_jax import run_lock  # pylint: disable=import-outside-toplevel
  lock, refused = None, None
  if jax.process_index() == 0:
    try:
      lock = run_lock.acquire(workdir)
    except run_lock.RunLocked as e:
      refused = e
  if jax.process_count() > 1:
    held = bool(multihost_utils.broadcast_one_to_all(np.int32(refused is None)))
    if not held and refused is None:
      refused = run_lock.RunLocked(f"{workdir}: process 0 could not take the run lock (its "
                                   f"last line says why)")
  if refused is not None:
    raise refused
  return lock


def main(argv):
  del argv
  started = _Started()
  try:
    _main(started)
  except KeyboardInterrupt:  # Ctrl-C outside the training loop (the loop saves, then stops)
    line = ("error: interrupted (SIGINT) before the training loop began or while it finished; "
            "nothing was saved since the newest checkpoint: --resume continues from it")
    _record_end(started, "interrupted", error=line)
    print(line, file=sys.stderr, flush=True)
    sys.exit(130)
  except Exception as e:  # pylint: disable=broad-except
    if started.distributed:
      from dapo_jax import distributed  # pylint: disable=import-outside-toplevel
      line = distributed.fault_line(e)
    else:
      line = refusals.error_line(e)
    _record_end(started, "failed", error=line or f"error: {refusals.one_line(repr(e))}")
    if line is None:
      raise
    refusals.stop(e, line, debug=FLAGS.debug,
                  workdir=started.workdir if started.lock is not None else None)
  finally:
    if started.lock is not None:
      started.lock.release()


def _record_end(started: _Started, state: str, **fields) -> None:
  """state.json for a start that held the workdir (a refused start leaves the holder's)."""
  if started.lock is not None:
    from dapo_jax import run_state  # pylint: disable=import-outside-toplevel
    run_state.write(started.workdir, state, **fields)


def _main(started: _Started):
  # Imports after flag parsing: config errors surface before JAX starts.
  from dapo_jax import config as config_lib, distributed  # pylint: disable=import-outside-toplevel
  cfg = config_lib.parse(FLAGS.config, config_flags.get_override_values(FLAGS["config"]))
  quiet.library_info_off_console()
  started.workdir = workdir = paths.as_str(FLAGS.workdir)  # a URL stays a URL
  distributed.initialize(cfg.distributed)
  started.distributed = True
  started.lock = _hold(workdir)
  done = _finished(workdir, cfg.train.num_steps) if FLAGS.resume else None
  if done is not None:
    print(f"[resume] {workdir} already finished its {done['steps']} steps (results.json): "
          f"nothing to do", flush=True)
    return
  if started.lock is not None:  # process 0
    quiet.keep_library_log(workdir)
  _, results = run_job(cfg, workdir, resume=FLAGS.resume,
                       config_json=FLAGS.config.to_json_best_effort(indent=2))
  if results.get("preempted"):  # saved after a stop signal: not a success for a controller
    sys.exit(run_state.PREEMPTED_EXIT)


def run_job(cfg, workdir: str, *, resume: bool, config_json: str):
  """The job in a workdir this process holds: the start checks, build, the config recorded,
  training, then the export and results (`finish`). Returns (the train.run.Run, results)."""
  import jax  # pylint: disable=import-outside-toplevel
  from dapo_jax import run_config  # pylint: disable=import-outside-toplevel
  start = run_config.check_start(cfg, workdir, resume=resume)
  quiet.import_tensorflow()  # before JetStream imports it: no CUDA / oneDNN start-up notices
  from dapo_jax.train import trainer  # pylint: disable=import-outside-toplevel
  run = trainer.build(cfg, workdir, resume=resume)
  if jax.process_index() == 0:  # every check passed: this start is the run's
    run_config.record_start(workdir, cfg, start, config_json=config_json)
    run_state.write(workdir, "running")
  results = trainer.train(run, resume=resume)
  if results.get("preempted"):
    print(f"[preempt] saved step {results['steps']} in {workdir}/checkpoints; exiting. Continue "
          f"with --resume", flush=True)
    if jax.process_index() == 0:
      run_state.write(workdir, "preempted", step=results["steps"], signal=results["signal"])
  else:
    finish(run, results, workdir)
  return run, results


def export(run, out: str) -> None:
  """The trained policy as an HF checkpoint in `out` (local or a bucket); a failed write is a
  Refusal naming `out` (the run's last checkpoint is intact, so --resume exports again)."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from safetensors import SafetensorError  # pylint: disable=import-outside-toplevel
  from dapo_jax.models import hf_io  # pylint: disable=import-outside-toplevel
  try:
    # Every process takes part (the params are gathered across hosts); process 0 writes.
    hf_io.save_pretrained(nnx.merge(run.model.graphdef, run.loop.state.params), run.model.model_config, out,
                          overwrite=True)
    if jax.process_index() == 0:
      with paths.staged_dir(out) as local:
        run.task.tokenizer.save_pretrained(local)
  except (OSError, SafetensorError) as e:
    why = refusals.os_error_text(e) if isinstance(e, OSError) else refusals.one_line(e)
    raise refusals.Refusal(
        f"export of the trained policy to {out} failed: {why}. The run's last checkpoint "
        f"(step {run.loop.step}) is intact: fix the cause (free space there) and rerun with "
        f"--resume to export again") from e
  if jax.process_index() == 0:
    print(f"[export] HF checkpoint: {out}")


def finish(run, results: dict, workdir: str) -> None:
  """A finished run's export (checkpoint.export_hf), results.json and report."""
  import jax  # pylint: disable=import-outside-toplevel
  if run.cfg.checkpoint.export_hf:
    export(run, f"{workdir}/export")
  if jax.process_index() == 0:
    paths.write_text(f"{workdir}/results.json", json.dumps(results, indent=2))
    run_state.write(workdir, "finished", step=results["steps"])
    _report(results, run.cfg.eval.num_samples, workdir)


def _report(results: dict, k: int, workdir: str):
  if "before" in results:
    print(f"[eval] before: avg@{k} {_fmt(results['before'], f'avg@{k}')}")
  print(f"[eval] after:  avg@{k} {_fmt(results['after'], f'avg@{k}')}")
  print(f"[logs] {workdir}/metrics.jsonl, tensorboard in {workdir}/tensorboard")


def parse_flags(argv):
  """absl's flag parsing, with a bad flag or config file ending in one `error:` line."""
  try:
    rest = FLAGS(argv)
    FLAGS.config.to_dict()  # a config file that failed to load raises here
    return rest
  except Exception as e:  # pylint: disable=broad-except
    if "--debug" in argv:
      traceback.print_exception(e)
    print(refusals.flag_error_line(e, argv), file=sys.stderr, flush=True)
    sys.exit(1)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
