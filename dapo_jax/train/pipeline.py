"""Rollout and training at the same time, the lag bounded by `rollout.max_staleness` = k >= 1.

One thread drives both roles through JAX's asynchronous dispatch: the step's update is
dispatched (it runs on the trainer's devices) and, while it runs, the sampler collects the
batches of the next steps on its own devices (`rollout.placement="split"`; colocated, the two
share the devices and their device work takes turns), one generation round at a time. The
update's end is polled between rounds, and with `rollout.partial` between decode chunks too:
its weights are then synced into the sampler at once and unfinished sequences continue under
them, their later tokens recording the newer policy version.

The bound: a batch that step d trains is sampled only while the sampler's policy version v
satisfies d - v <= k; every token it holds is then at most k versions older than the policy
that trains on it (versions only grow). When the bound stops the sampler, it waits for the
update (`time_wait_weights_s`); when the next step has no batch yet, the trainer waits for the
sampler (`time_wait_data_s`).

With several processes a weight sync is a collective, so every process syncs at the same
round boundary (when every process has seen the update end); mid-round syncs (partial
rollouts) happen only in a single-process run.

A checkpoint records the prompt iterator as it was before the oldest batch not yet trained: a
resumed run samples those batches again, with the checkpoint's weights.
"""
import collections
import dataclasses
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from dapo_jax.train import multihost
from dapo_jax.train.collector import Collector
from dapo_jax.train.groups import Groups
from dapo_jax.train.run import Run


@dataclasses.dataclass
class Collected:
  """A kept batch waiting for the step that trains it."""
  groups: Groups
  summary: dict           # the batch's metrics (Collector.result)
  step: int               # the step that trains it
  data_state: dict        # the prompt iterator before its first round (a resume restarts there)


class Pipeline:
  """The sampler's side of the asynchronous loop (see the module docstring)."""

  def __init__(self, run: Run):
    rollout = run.cfg.rollout
    self.k, self.partial = rollout.max_staleness, rollout.partial and not multihost.is_multi()
    self.buffer: collections.deque[Collected] = collections.deque()
    self.filling: Collector | None = None  # the batch under way
    self.next_step = run.loop.step          # the step the next batch started is for
    self.in_flight: int | None = None  # the policy version the running update produces
    self.update_end: float | None = None
    self.times = collections.Counter()  # this step's rollout / wait / sync seconds

  # ----- the trainer's side ---------------------------------------------------------------

  def take(self, run: Run) -> Collected:
    """The batch of this step; collected now (the trainer waits) when none is buffered."""
    t0 = time.perf_counter()
    while not self.buffer:
      self._round(run)
    self.times["wait_data"] += time.perf_counter() - t0
    return self.buffer.popleft()

  def collect_ahead(self, run: Run, version: int) -> None:
    """While the update producing policy `version` runs: collect the next batches as the bound
    allows, sync the update's weights as soon as it ends, and return once it has ended and the
    next step has a batch."""
    self.in_flight, self.update_end = version, None
    while True:
      if self._update_ended(run):
        self._sync(run)
        if self.buffer:
          return
        t0 = time.perf_counter()
        self._round(run)  # the trainer waits for its next batch
        self.times["wait_data"] += time.perf_counter() - t0
      elif self.next_step - run.sampler.version > self.k and self.filling is None:
        self._wait_update(run)  # the bound: the sampler waits for weights
      else:
        self._round(run)

  def finish_update(self, run: Run) -> float:
    """Waits for the update if it still runs, syncs its weights; returns when it ended."""
    if not self._update_ended(run):
      self._wait_update(run)
    self._sync(run)
    return self.update_end

  def resume_data_state(self, run: Run) -> dict:
    """The prompt iterator's state before the oldest batch not yet trained."""
    if self.buffer:
      return self.buffer[0].data_state
    return self.filling.data_state if self.filling else run.data.state()

  def step_times(self) -> dict:
    """This step's rollout / wait / sync seconds (then reset)."""
    out = {f"time_{k}_s": v for k, v in self.times.items()}
    self.times.clear()
    return out

  # ----- the sampler's side ---------------------------------------------------------------

  def _round(self, run: Run) -> None:
    """One generation round of the batch under way (a new one if none is)."""
    if self.filling is None:
      self.filling = Collector.start(run, self.next_step,
                                     between_chunks=self._between_chunks(run))
      self.next_step += 1
    t0 = time.perf_counter()
    self.filling.round()
    self.times["rollout"] += time.perf_counter() - t0
    f = self.filling
    if f.done:
      batch, summary = f.result(run)
      self.buffer.append(Collected(batch, summary, f.step, f.data_state))
      self.filling = None

  def _between_chunks(self, run: Run):
    """Partial rollouts: the finished update's weights go in between two decode chunks."""
    if not self.partial:
      return None

    def poll():
      if self.in_flight is not None and self._update_ended(run):
        self._sync(run)
    return poll

  def _update_ended(self, run: Run) -> bool:
    """Whether the running update has ended (on every process); notes when it was seen."""
    if self.update_end is not None or self.in_flight is None:
      return True
    ready = bool(run.loop.state.updates.is_ready())
    if multihost.is_multi():  # every process decides the same (a sync is a collective)
      ready = bool(np.all(multihost_utils.process_allgather(np.int32(ready))))
    if ready:
      self.update_end = time.perf_counter()
    return ready

  def _wait_update(self, run: Run) -> None:
    t0 = time.perf_counter()
    jax.block_until_ready(run.loop.state)
    self.update_end = time.perf_counter()
    self.times["wait_weights"] += self.update_end - t0

  def _sync(self, run: Run) -> None:
    """The ended update's weights into the sampler (once per update)."""
    if self.in_flight is None or run.sampler.version >= self.in_flight:
      return
    t0 = time.perf_counter()
    run.sampler.update_params(run.loop.state.params, version=self.in_flight)
    self.times["sync"] += time.perf_counter() - t0
