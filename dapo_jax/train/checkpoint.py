"""Orbax checkpoints of a run: train state (params, optimizer, update count) and host metadata.

Metadata holds the rollout step, the data iterator position, the health monitor's reference
length, the run's RNG seed and the config, so `--resume` continues exactly. Saves are
asynchronous, keep the last N, and atomic: orbax writes into a temporary directory and renames
it when complete, and a half-written step is never listed by `latest_step`.
"""
import os

import jax
import orbax.checkpoint as ocp


class Checkpointer:

  def __init__(self, directory: str, *, keep: int, async_save: bool):
    self.directory = os.path.abspath(directory)
    self._mngr = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                             enable_async_checkpointing=async_save,
                                             create=True))

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, step: int, state, meta: dict):
    """Starts a save of the device state and the JSON metadata (returns before it completes
    when asynchronous; the next save or `wait` waits for it)."""
    self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                  meta=ocp.args.JsonSave(meta)))

  def restore(self, step: int, abstract_state):
    """(state, meta) of `step`; each array is placed with abstract_state's sharding."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return out["state"], out["meta"]

  def wait(self):
    self._mngr.wait_until_finished()

  def close(self):
    self._mngr.wait_until_finished()
    self._mngr.close()
