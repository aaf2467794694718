"""The command line of one dapo_jax job (dapo_jax.job): warm start (if configured), DAPO training,
before/after evaluation.

  python -m dapo_jax.main --config=configs/tiny_cpu.py --workdir=runs/tiny
  python -m dapo_jax.main --config=configs/ladder.py:rung=naive_grpo --workdir=runs/naive
  python -m dapo_jax.main --config=configs/tiny_cpu.py --config.algo.eps_high=0.4 --workdir=...
  ... --workdir=gs://bucket/runs/tiny   # a bucket: checkpoints, logs and results go there
  ... --resume   # continue from the workdir's newest intact checkpoint
  ... --debug    # on a refusal, print the traceback above the error line

The workdir is the run's own: `run.lock` there names the holder, and a second run on it is
refused (dapo_jax.workdir.lock). A resume keeps the config the checkpoint was trained with; only the
fields in run_config.RESUMABLE may change, and each start is appended to config.history.jsonl
before config.json is replaced (dapo_jax.workdir.run_config). SIGTERM (a preemption notice), SIGINT
(Ctrl-C) and SIGHUP save a checkpoint at the end of the current step and exit with status 75
(run_state.PREEMPTED_EXIT: a job controller restarts it); `--resume` continues from it.
`<workdir>/state.json` records how the start ended (dapo_jax.workdir.run_state). Resuming
a run that finished does nothing. Every refusal a user can cause (a config value, a data row,
a resume that changes the experiment, a full disk, a failed save or export, a lost peer) ends
with exit status 1 and one `error: ...` line, last on stderr; the traceback goes to
<workdir>/errors.log, and above that line with --debug (dapo_jax.refusals).
"""
import dataclasses
import sys
import traceback

from absl import app, flags
from ml_collections import config_flags

from dapo_jax import quiet, refusals
from dapo_jax.workdir import paths, run_state

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


def _hold(workdir: str):
  """Process 0 takes the workdir's lock; every process learns whether it did."""
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel
  from dapo_jax.workdir import lock as run_lock  # pylint: disable=import-outside-toplevel
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
    code = _main(started)
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
  if started.distributed:  # every process succeeded: they leave together
    from dapo_jax import distributed  # pylint: disable=import-outside-toplevel
    distributed.finish()
  if code:
    sys.exit(code)


def _record_end(started: _Started, state: str, **fields) -> None:
  """state.json for a start that held the workdir (a refused start leaves the holder's)."""
  if started.lock is not None:
    run_state.write(started.workdir, state, **fields)


def _main(started: _Started) -> int:
  """The job; returns the exit code of a run that ended without error (0, or preempted)."""
  # Imports after flag parsing: config errors surface before JAX starts.
  from dapo_jax import config as config_lib, distributed  # pylint: disable=import-outside-toplevel
  cfg = config_lib.parse(FLAGS.config, config_flags.get_override_values(FLAGS["config"]))
  quiet.library_info_off_console()
  started.workdir = workdir = paths.as_str(FLAGS.workdir)  # a URL stays a URL
  distributed.cpu_devices_for_mesh(cfg)
  distributed.initialize(cfg.distributed)
  started.distributed = True
  started.lock = _hold(workdir)
  from dapo_jax import job  # pylint: disable=import-outside-toplevel
  done = job.finished_results(workdir, cfg.train.num_steps) if FLAGS.resume else None
  if done is not None:
    print(f"[resume] {workdir} already finished its {done['steps']} steps (results.json): "
          f"nothing to do", flush=True)
    return 0
  if started.lock is not None:  # process 0
    quiet.keep_library_log(workdir)
  _, results = job.run_job(cfg, workdir, resume=FLAGS.resume,
                           config_json=FLAGS.config.to_json_best_effort(indent=2))
  # saved after a stop signal: not a success for a controller
  return run_state.PREEMPTED_EXIT if results.get("preempted") else 0


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
