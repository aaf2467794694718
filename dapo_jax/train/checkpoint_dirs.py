"""Which checkpoint steps a run directory holds, without importing JAX (etils.epath only, so a
local directory or a bucket): the one answer to "is there a checkpoint?" for the trainer, the
checkpointer and experiments/launch.py (a step is a directory whose name is its step number)."""
import os

from etils import epath


def steps(directory) -> list[int]:
  """Committed step directories under `directory`, oldest first ([] if it does not exist)."""
  root = epath.Path(os.fspath(directory))
  if not root.is_dir():
    return []
  return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())


def latest(directory) -> int | None:
  """The newest committed step, or None."""
  found = steps(directory)
  return found[-1] if found else None


def check_fresh(directory) -> None:
  """A run that starts at step 0 must not write into an earlier run's checkpoints and logs."""
  found = steps(directory)
  if found:
    raise ValueError(f"{directory} holds checkpoints (steps {found}) of an earlier run: pass "
                     f"--resume to continue it, or use a new --workdir")
