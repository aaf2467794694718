"""Orbax checkpoints of a run, verified: train state (params, optimizer, update count) and metadata.

Metadata holds the rollout step, the data iterator position, the health monitor's reference
length, the run's RNG seed, the metrics.jsonl record count and the config, so `--resume`
continues exactly. Saves are asynchronous and keep the last N.

Integrity. Orbax writes a step into `<step>.orbax-checkpoint-tmp` and renames it when complete.
Just before that rename (orbax's post-finalization callback) this module writes `dapo_sha256.json`
into the step: the size and sha256 of every file. A committed step therefore always carries its
manifest; one without it was never finished. `restore_latest` checks the steps newest first and
restores the first whose files all match and whose arrays are finite; each rejected step is
reported by name and moved to `<workdir>/corrupt_checkpoints/` (so the run can save that step
again). A save that fails (disk full, unwritable directory) raises CheckpointError naming the path,
and no temporary directory is left behind.
"""
import glob
import hashlib
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from dapo_jax.train import checkpoint_dirs

MANIFEST = "dapo_sha256.json"
TMP_MARK = ".orbax-checkpoint-tmp"
# Orbax rewrites this step metadata (commit time) after the rename: it must exist, but its bytes
# are not fixed at the manifest.
MUTABLE = ("_CHECKPOINT_METADATA",)


class CheckpointError(RuntimeError):
  """A save or restore that cannot go on; the message names the path and what to do."""


def _sha256(path: str) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      h.update(chunk)
  return h.hexdigest()


def _files(step_dir: str) -> list[str]:
  out = []
  for root, _, names in os.walk(step_dir):
    out += [os.path.relpath(os.path.join(root, n), step_dir) for n in names]
  return sorted(f for f in out if not f.startswith(MANIFEST))


def write_manifest(step_dir: str) -> None:
  """Writes `step_dir/dapo_sha256.json`: {relative path: [bytes, sha256]} of every file."""
  entries = {}
  for rel in _files(step_dir):
    path = os.path.join(step_dir, rel)
    entries[rel] = [None, None] if rel in MUTABLE else [os.path.getsize(path), _sha256(path)]
  tmp = os.path.join(step_dir, MANIFEST + ".partial")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(entries, f, indent=0, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, os.path.join(step_dir, MANIFEST))


def verify(step_dir: str) -> str | None:
  """None when every file in the step's manifest has its saved size and sha256; else why not."""
  path = os.path.join(step_dir, MANIFEST)
  if not os.path.exists(path):
    return f"no {MANIFEST} (its save never completed)"
  try:
    with open(path, encoding="utf-8") as f:
      entries = json.load(f)
  except (OSError, ValueError) as e:
    return f"unreadable {MANIFEST}: {e}"
  for rel, (size, digest) in sorted(entries.items()):
    file = os.path.join(step_dir, rel)
    if not os.path.isfile(file):
      return f"{rel} is missing"
    if size is None:
      continue
    if os.path.getsize(file) != size:
      return f"{rel} has {os.path.getsize(file)} bytes, {size} when saved (truncated or altered)"
    if _sha256(file) != digest:
      return f"{rel} does not match its sha256 from the save (altered)"
  return None


@jax.jit
def _finite(tree):
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def all_finite(tree) -> bool:
  """Whether every float array of `tree` is finite (every process gets the same answer)."""
  out = _finite(tree)
  return bool(np.asarray(out.addressable_shards[0].data))


def _agree(value: bool) -> bool:
  """Process 0's value on every process (one host checks files; all must decide alike)."""
  if jax.process_count() == 1:
    return value
  return bool(multihost_utils.broadcast_one_to_all(np.int32(value)))


def _first_line(e: BaseException) -> str:
  text = str(e).strip() or type(e).__name__
  return text.splitlines()[0][:500]


class Checkpointer:

  def __init__(self, directory: str, *, keep: int, async_save: bool):
    self.directory = os.path.abspath(directory)
    self.async_save = async_save
    self._saving = None  # the step whose save is in flight
    try:
      # Orbax creates the directory in a background thread and only logs a failure there.
      os.makedirs(self.directory, exist_ok=True)
      probe = os.path.join(self.directory, ".write_probe")
      with open(probe, "w", encoding="utf-8") as f:
        f.write("ok")
      os.remove(probe)
      # Always orbax's asynchronous checkpointer: its callback runs before the commit rename (a
      # synchronous save just waits). cleanup_tmp_directories drops a save cut off by a kill.
      self._mngr = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=True, cleanup_tmp_directories=True,
          enable_async_checkpointing=True,
          async_options=ocp.AsyncOptions(post_finalization_callback=self._seal)))
    except OSError as e:
      raise CheckpointError(f"cannot use checkpoint directory {self.directory}: {e}") from e

  def _seal(self):
    """Orbax's callback just before the rename that commits a step: write its manifest."""
    if jax.process_index() != 0:
      return
    tmps = glob.glob(os.path.join(self.directory, f"{self._saving}{TMP_MARK}*"))
    if len(tmps) != 1:
      raise CheckpointError(f"step {self._saving}: expected one {TMP_MARK} directory in "
                            f"{self.directory}, found {tmps}")
    write_manifest(tmps[0])

  def steps(self) -> list[int]:
    """Committed step directories on disk, oldest first (intact or not)."""
    return checkpoint_dirs.steps(self.directory)

  def latest_step(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, step: int, state, meta: dict):
    """Starts a save of the device state and the JSON metadata (returns before it completes
    when asynchronous; `poll`, the next save or `wait` reports its failure)."""
    self.wait()  # orbax would wait too; here its failure is reported as the previous step's
    self._check_space(step, state)
    self._saving = step
    try:
      self._mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                    meta=ocp.args.JsonSave(meta)))
    except Exception as e:  # orbax raises ValueError/OSError/...: each means this save failed
      raise self._failed(e) from e
    if not self.async_save:
      self.wait()

  def _check_space(self, step: int, state):
    need = sum(int(x.nbytes) for x in jax.tree.leaves(state))
    free = shutil.disk_usage(self.directory).free
    if need > free:
      raise CheckpointError(
          f"checkpoint save of step {step} to {self.directory}: needs about {need:,} bytes, "
          f"{free:,} free there. Free space (the previous checkpoint, step {self._last()}, is "
          f"intact) and rerun with --resume")

  def _last(self) -> int | None:
    return max(self.steps(), default=None)

  def _failed(self, e: BaseException) -> CheckpointError:
    """The error for a failed save, after removing its temporary directory."""
    if jax.process_index() == 0:
      for tmp in glob.glob(os.path.join(self.directory, f"*{TMP_MARK}*")):
        shutil.rmtree(tmp, ignore_errors=True)
    return CheckpointError(
        f"checkpoint save of step {self._saving} to {self.directory} failed: {_first_line(e)}. "
        f"The previous checkpoint (step {self._last()}) is intact; fix the cause and rerun with "
        f"--resume")

  def poll(self):
    """Raises now if a background save has failed (call at every step boundary)."""
    if self._saving is not None and not self._mngr.is_saving_in_progress():
      self.wait()

  def wait(self):
    try:
      self._mngr.wait_until_finished()
    except Exception as e:  # the background save's own error, whatever orbax wrapped it in
      raise self._failed(e) from e
    self._saving = None

  def restore(self, step: int, abstract_state):
    """(state, meta) of `step`; each array is placed with abstract_state's sharding."""
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, abstract_state)
    out = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return out["state"], out["meta"]

  def restore_latest(self, abstract_state):
    """(step, state, meta) of the newest intact checkpoint; None when there is no step at all.

    Rejected steps are reported by name; the newer ones are moved aside once an older one
    restores. When none restores: CheckpointError saying what to delete."""
    rejected = []
    for step in reversed(self.steps()):
      step_dir = os.path.join(self.directory, str(step))
      reason = verify(step_dir) if jax.process_index() == 0 else None
      if _agree(reason is None):
        state, meta = self._restore_intact(step, abstract_state)
        if all_finite(state):
          self._set_aside(rejected)
          return step, state, meta
        reason = "non-finite values in its parameters or optimizer state"
      if jax.process_index() == 0:
        print(f"[checkpoint] step {step} ({step_dir}) is unusable: {reason}", flush=True)
      rejected.append(step)
    if rejected:
      raise CheckpointError(
          f"no usable checkpoint in {self.directory}: steps {sorted(rejected)} failed their "
          f"checks (see above). Delete {self.directory} and rerun to start over, or put back "
          f"a good copy of one of those step directories")
    return None

  def _restore_intact(self, step: int, abstract_state):
    try:
      return self.restore(step, abstract_state)
    except Exception as e:  # its files match the save, so this is no corruption: stop here
      raise CheckpointError(
          f"checkpoint step {step} in {self.directory} is intact (checksums match) but does "
          f"not restore into this run: {_first_line(e)}. Did the model or optimizer config "
          f"change since it was saved?") from e

  def _set_aside(self, steps: list[int]):
    """Moves rejected steps to <workdir>/corrupt_checkpoints/ (kept for inspection)."""
    if not steps:
      return
    aside = os.path.join(os.path.dirname(self.directory), "corrupt_checkpoints")
    if jax.process_index() == 0:
      os.makedirs(aside, exist_ok=True)
      for step in steps:
        dst = os.path.join(aside, str(step))
        while os.path.exists(dst):
          dst += "_"
        shutil.move(os.path.join(self.directory, str(step)), dst)
        print(f"[checkpoint] moved the unusable step {step} to {dst}", flush=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("dapo_jax_checkpoint_set_aside")
    self._mngr.reload()

  def close(self):
    self.wait()
    self._mngr.close()
