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

The directory may be local or a bucket (gs://): every file access goes through dapo_jax.workdir.paths.
In a bucket orbax has no rename to commit with; it writes the step in place and commits it with
a `commit_success.txt` written after the callback, so the manifest is written into the step
directory itself there.
"""
import hashlib
import json

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from dapo_jax.workdir import paths
from dapo_jax.train import checkpoint_dirs

MANIFEST = "dapo_sha256.json"
TMP_MARK = ".orbax-checkpoint-tmp"
# Orbax rewrites this step metadata (commit time) after the rename: it must exist, but its bytes
# are not fixed at the manifest.
MUTABLE = ("_CHECKPOINT_METADATA",)


class CheckpointError(RuntimeError):
  """A save or restore that cannot go on; the message names the path and what to do."""


def _sha256(path) -> str:
  h = hashlib.sha256()
  with paths.resolve(path).open("rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      h.update(chunk)
  return h.hexdigest()


def _size(path) -> int:
  return int(paths.resolve(path).stat().length)


def _files(step_dir) -> list[str]:
  return [f for f in paths.relative_files(step_dir) if not f.startswith(MANIFEST)]


def write_manifest(step_dir) -> None:
  """Writes `step_dir/dapo_sha256.json`: {relative path: [bytes, sha256]} of every file."""
  step_dir = paths.resolve(step_dir)
  entries = {}
  for rel in _files(step_dir):
    path = step_dir / rel
    entries[rel] = [None, None] if rel in MUTABLE else [_size(path), _sha256(path)]
  paths.write_text(step_dir / MANIFEST, json.dumps(entries, indent=0, sort_keys=True))


def verify(step_dir) -> str | None:
  """None when every file in the step's manifest has its saved size and sha256; else why not."""
  step_dir = paths.resolve(step_dir)
  if not (step_dir / MANIFEST).exists():
    return f"no {MANIFEST} (its save never completed)"
  try:
    entries = json.loads((step_dir / MANIFEST).read_text())
  except (OSError, ValueError) as e:
    return f"unreadable {MANIFEST}: {e}"
  for rel, (size, digest) in sorted(entries.items()):
    file = step_dir / rel
    if not file.exists() or file.is_dir():
      return f"{rel} is missing"
    if size is None:
      continue
    if _size(file) != size:
      return f"{rel} has {_size(file)} bytes, {size} when saved (truncated or altered)"
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


def _probe(directory: str) -> None:
  """Creates `directory` and writes, then removes, a file there (removed even when the write
  fails, e.g. on a full disk): OSError when it cannot be used."""
  probe = paths.makedirs(directory) / ".write_probe"
  try:
    probe.write_text("ok")
  finally:
    probe.unlink(missing_ok=True)


class Checkpointer:

  def __init__(self, directory: str, *, keep: int, async_save: bool):
    self.directory = paths.as_str(directory)  # a URL stays a URL
    self.async_save = async_save
    self._saving = None  # the step whose save is in flight
    try:
      # Orbax creates the directory in a background thread and only logs a failure there.
      _probe(self.directory)
      # Always orbax's asynchronous checkpointer: its callback runs before the commit rename (a
      # synchronous save just waits). cleanup_tmp_directories drops a save cut off by a kill.
      self._mngr = ocp.CheckpointManager(self.directory, options=ocp.CheckpointManagerOptions(
          max_to_keep=keep, create=True, cleanup_tmp_directories=True,
          enable_async_checkpointing=True,
          async_options=ocp.AsyncOptions(post_finalization_callback=self._seal)))
    except OSError as e:
      raise CheckpointError(f"cannot use checkpoint directory {self.directory}: {e}") from e

  def _seal(self):
    """Orbax's callback just before the commit of a step (the rename of its temporary
    directory; in a bucket, the commit file): write its manifest."""
    if jax.process_index() != 0:
      return
    root = paths.resolve(self.directory)
    tmps = list(root.glob(f"{self._saving}{TMP_MARK}*"))
    if not tmps and paths.is_url(root):  # committed by a file, written in place
      tmps = [root / str(self._saving)]
    if len(tmps) != 1:
      raise CheckpointError(f"step {self._saving}: expected one {TMP_MARK} directory in "
                            f"{self.directory}, found {[str(t) for t in tmps]}")
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
    free = paths.free_bytes(self.directory)  # None: a bucket
    if free is not None and need > free:
      raise CheckpointError(
          f"checkpoint save of step {step} to {self.directory}: needs about {need:,} bytes, "
          f"{free:,} free there. Free space (the previous checkpoint, step {self._last()}, is "
          f"intact) and rerun with --resume")

  def _last(self) -> int | None:
    return max(self.steps(), default=None)

  def _failed(self, e: BaseException) -> CheckpointError:
    """The error for a failed save, after removing its temporary directory."""
    if jax.process_index() == 0:
      for tmp in paths.resolve(self.directory).glob(f"*{TMP_MARK}*"):
        tmp.rmtree(missing_ok=True)
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

  def meta(self, step: int) -> dict:
    """The JSON metadata of `step` alone (what a run checks before restoring its arrays)."""
    return self._mngr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]

  def restore_latest(self, abstract_state):
    """(step, state, meta) of the newest intact checkpoint; None when there is no step at all.

    Rejected steps are reported by name; the newer ones are moved aside once an older one
    restores. When none restores: CheckpointError saying what to delete."""
    rejected = []
    for step in reversed(self.steps()):
      step_dir = f"{self.directory}/{step}"
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
    aside = paths.makedirs(paths.resolve(self.directory).parent / "corrupt_checkpoints") \
        if jax.process_index() == 0 else None
    if jax.process_index() == 0:
      for step in steps:
        dst = f"{aside}/{step}"
        while paths.resolve(dst).exists():
          dst += "_"
        paths.move_tree(f"{self.directory}/{step}", dst)
        print(f"[checkpoint] moved the unusable step {step} to {dst}", flush=True)
    if jax.process_count() > 1:
      multihost_utils.sync_global_devices("dapo_jax_checkpoint_set_aside")
    self._mngr.reload()

  def close(self):
    self.wait()
    self._mngr.close()
