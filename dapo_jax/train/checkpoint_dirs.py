"""Which checkpoint steps a run directory holds: stdlib only, so the launcher can ask without
importing JAX. The one answer to "is there a checkpoint?" for the trainer, the checkpointer and
experiments/launch.py (a step is a directory whose name is its step number)."""
import os


def steps(directory: str) -> list[int]:
  """Committed step directories under `directory`, oldest first ([] if it does not exist)."""
  if not os.path.isdir(directory):
    return []
  return sorted(int(d) for d in os.listdir(directory)
                if d.isdigit() and os.path.isdir(os.path.join(directory, d)))


def latest(directory: str) -> int | None:
  """The newest committed step, or None."""
  found = steps(directory)
  return found[-1] if found else None
