"""MetricWriter's Weights & Biases sink (log.wandb): the scalars TensorBoard gets, at the same
steps, in one wandb run per workdir.

wandb is optional (requirements-dev.txt, not requirements.txt): it is imported only when
log.wandb is on, and config validation refuses log.wandb=True where it does not import, before
anything compiles. The run's id is kept in <workdir>/wandb_id.txt from the first start, so a
--resume continues the same wandb run. wandb has no purge step like TensorBoard's: the steps
logged between the restored checkpoint and a kill are logged again after the resume (online,
wandb keeps their first values: it ignores a step below the run's last). `WANDB_MODE=offline`
writes each start's part of the run under <workdir>/wandb/ for `wandb sync`.
"""
import tempfile
import uuid

from dapo_jax.workdir import paths
from dapo_jax.workdir import run_config

ID_FILE = "wandb_id.txt"


def run_id(workdir) -> str:
  """The workdir's wandb run id: read from ID_FILE, or made and written there at the first start."""
  path = paths.resolve(workdir) / ID_FILE
  if path.exists():
    return paths.read_text(path).strip()
  rid = uuid.uuid4().hex[:16]  # wandb's id alphabet: lower-case letters and digits
  paths.write_text(path, rid + "\n")
  return rid


def local_dir(workdir) -> str:
  """Where wandb keeps its own files (offline run, logs; it adds a `wandb/` folder): the workdir
  when local; for a bucket a local temporary directory, as wandb writes only to local disk."""
  if paths.is_url(workdir):
    return tempfile.mkdtemp(prefix="dapo_jax_wandb_")
  return paths.as_str(workdir)


class WandbSink:
  """One wandb run: `log(step, scalars)` per record, `close()` at the end of the run."""

  def __init__(self, workdir, *, project: str, entity: str, name: str, config: dict):
    import wandb  # pylint: disable=import-outside-toplevel  (optional: only when log.wandb)
    self.run_id = run_id(workdir)
    # silent: no banners (the console holds one line per step); console="off": stdout and
    # stderr stay the process's own (a refusal's `error:` line is last on stderr).
    self._run = wandb.init(
        project=project, entity=entity or None,
        name=name or paths.as_str(workdir).rstrip("/").rsplit("/", 1)[-1],
        id=self.run_id, resume="allow", dir=local_dir(workdir), config=config,
        settings=wandb.Settings(silent=True, console="off"))

  def log(self, step: int, scalars: dict) -> None:
    self._run.log(scalars, step=step)

  def close(self) -> None:
    self._run.finish()


def options(cfg) -> dict | None:
  """WandbSink's keywords from a run's Config (the whole config as the run's config); None
  when log.wandb is off."""
  if not cfg.log.wandb:
    return None
  return {"project": cfg.log.wandb_project, "entity": cfg.log.wandb_entity,
          "name": cfg.log.wandb_name, "config": run_config.as_record(cfg)}
