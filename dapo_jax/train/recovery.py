"""Recovery of a run: restore from the newest intact checkpoint, and stop cleanly on a signal.

SIGTERM (a preemption notice), SIGINT (Ctrl-C) and SIGHUP (the terminal or ssh session that
started the run went away) all mean: finish the current rollout step, save a checkpoint, stop
(dapo_jax.main then exits with run_state.PREEMPTED_EXIT). The handler only sets a flag; the
loop reads it at each step boundary, where the state is consistent. The time from the signal to
exit is therefore at most one rollout step plus one save. A second signal of the same kind ends
the process at once (its default action: exit status 128 + the signal's number), for when that
is too long.
"""
import os
import signal
import threading

import jax
import numpy as np
from jax.experimental import multihost_utils

from dapo_jax.core import overlong
from dapo_jax.train import adapters, checkpoint_dirs


def start(run, ckpt, *, resume: bool) -> tuple[dict, int]:
  """Restores `run` (a train.run.Run) from the newest intact checkpoint of `ckpt` (with resume).

  Returns the results so far (the "before" eval) and the number of metrics.jsonl records
  written when that checkpoint was saved; ({}, 0) for a run that starts at step 0."""
  if not resume:
    checkpoint_dirs.check_fresh(ckpt.directory)  # never write into an earlier run's files
    return {}, 0
  newest = ckpt.latest_step()
  if newest is not None:  # LoRA or not, the same base: checked before any array is read
    adapters.check_restored(ckpt.meta(newest), run.model.base)
  got = ckpt.restore_latest(run.loop.state)
  if got is None:
    print(f"[resume] no checkpoint in {ckpt.directory}: starting at step 0", flush=True)
    return {}, 0
  _, run.loop.state, meta = got
  adapters.check_restored(meta, run.model.base)
  run.loop.step, run.loop.bad_steps, run.loop.first_length = meta["step"], meta["bad_steps"], meta["first_length"]
  run.data.restore(meta["data"])
  if run.prefilter is not None:  # the same prompts are skipped as without the restart
    run.prefilter.restore(meta["prefilter"])
  run.loop.length_history = overlong.history_from_state(meta["length_history"])
  run.sampler.update_params(run.loop.state.params, version=run.loop.step)
  print(f"[resume] from step {run.loop.step} in {ckpt.directory}", flush=True)
  return meta["results"], meta["metrics_records"]


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Notice:
  """Installs the stop-signal handlers for the lifetime of the training loop (`close` puts the
  previous ones back). `received`: the first signal's name (SIGTERM, ...), or None."""

  def __init__(self):
    self.received: str | None = None
    self._previous = {}
    # Python only lets the main thread set handlers; a loop run from another thread (a notebook
    # worker) keeps the default actions.
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}

  def _handle(self, signum, frame):
    del frame
    name = signal.Signals(signum).name
    if self.received == name:  # the second notice of a kind: stop now
      signal.signal(signum, signal.SIG_DFL)
      os.kill(os.getpid(), signum)
      return
    self.received = self.received or name
    # os.write, not print: a handler may interrupt a print in progress.
    os.write(2, f"[preempt] {name}: saving a checkpoint at the end of this step, then exiting "
                f"(a second {name} exits at once)\n".encode())

  def stop_now(self) -> bool:
    """Whether any process got a stop signal. A collective with several processes: every
    process calls it at the same step boundary, so all of them save and stop together."""
    if jax.process_count() == 1:
      return self.received is not None
    flags = multihost_utils.process_allgather(np.int32(self.received is not None))
    return bool(np.any(flags))

  def close(self):
    for s, previous in self._previous.items():
      signal.signal(s, previous)
    self._previous = {}
