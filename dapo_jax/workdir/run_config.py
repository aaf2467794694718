"""The config pinned to a run: what `--resume` may change, `config.json` and its history.

A resumed run must keep the fields that define the experiment (algorithm, optimizer, model,
data, seed): they are compared with the config saved in the newest checkpoint, and any
difference refuses the resume, listing each field. RESUMABLE lists the fields that may change,
each with the reason; every change is printed and recorded. `record_start` runs once every
check has passed: it appends the start (time, host, changes, the full config) to
`config.history.jsonl`, so the configs of earlier starts are kept, then replaces `config.json`
atomically.
"""
import dataclasses
import json
import socket
import time

from dapo_jax.workdir import paths
from dapo_jax.train import checkpoint_dirs

CONFIG_JSON = "config.json"
HISTORY = "config.history.jsonl"

# Fields a resume may change ("x." covers the whole section), and why they may.
RESUMABLE = {
    "train.num_steps": "how long the run goes on",
    "train.max_bad_steps": "when a run of non-finite updates stops it",
    "train.entropy_floor": "a warning threshold",
    "train.entropy_ceiling": "a warning threshold",
    "train.length_growth_warn": "a warning threshold",
    "eval.every_steps": "the eval cadence",
    "log.": "what is logged",
    "checkpoint.": "save cadence, checkpoints kept, asynchronous saves, the final export",
    "distributed.": "this launch's processes",
    "mesh.": "the device layout (a resumed run may land on another slice)",
    "rollout.num_slots": "the sampler's memory budget (the same samples)",
    "rollout.kv_cache_gib": "the sampler's memory budget (the same samples)",
    "rollout.placement": "which devices sample and which train (the same algorithm)",
    "rollout.sampler_devices": "which devices sample and which train (the same algorithm)",
    "train.micro_batch_size": "gradient accumulation: the same update in other slices",
    "model.remat": "memory: activations recomputed, the same maths",
    "model.logits_chunk": "memory: the same log-probs in other chunks",
    "model.attention_chunk": "memory: the same attention in other blocks",
}


@dataclasses.dataclass(frozen=True)
class Change:
  field: str
  old: object
  new: object


@dataclasses.dataclass(frozen=True)
class Start:
  """What `check_start` found: the checkpoint step the config was compared with (None for a
  fresh start or a workdir without checkpoints) and the resumable fields that change."""
  step: int | None
  changes: tuple


def resumable(field: str) -> bool:
  return any(field == k or (k.endswith(".") and field.startswith(k)) for k in RESUMABLE)


def as_record(cfg) -> dict:
  """The config as JSON values: the form the checkpoint's metadata holds (trainer._meta)."""
  return json.loads(json.dumps(dataclasses.asdict(cfg)))


def flatten(tree: dict, prefix: str = "") -> dict:
  """{"algo": {"eps_high": 0.28}} -> {"algo.eps_high": 0.28}."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = v
  return out


def saved_config(workdir) -> tuple[int, dict] | None:
  """(step, config) from the newest checkpoint whose metadata reads; None without one."""
  ckpts = paths.resolve(workdir) / "checkpoints"
  for step in reversed(checkpoint_dirs.steps(ckpts)):
    try:
      meta = json.loads((ckpts / str(step) / "meta" / "metadata").read_text())
      return step, dict(meta["config"])
    except (OSError, ValueError, KeyError, TypeError):
      continue  # a damaged step: the restore will say so; an older one has the same config
  return None


def check_start(cfg, workdir, *, resume: bool) -> Start:
  """Checks made before anything is built or written: a fresh start into a workdir holding
  checkpoints is refused; a resume keeping every pinned field of the checkpoint's config
  passes, with the resumable fields that change. ValueError otherwise, listing the fields."""
  if not resume:
    checkpoint_dirs.check_fresh(f"{paths.as_str(workdir)}/checkpoints")
    return Start(step=None, changes=())
  saved = saved_config(workdir)
  if saved is None:
    return Start(step=None, changes=())
  old_f, new_f = flatten(saved[1]), flatten(as_record(cfg))
  # A field only one side has (the code's config grew since the save) is not compared.
  diffs = tuple(Change(k, old_f[k], new_f[k]) for k in sorted(old_f)
                if k in new_f and old_f[k] != new_f[k])
  pinned = [d for d in diffs if not resumable(d.field)]
  if pinned:
    raise ValueError(_pinned_message(pinned, workdir, saved[0]))
  return Start(step=saved[0], changes=diffs)


def _pinned_message(pinned, workdir, step: int) -> str:
  listed = ", ".join(f"{d.field} {d.old!r} -> {d.new!r}" for d in pinned)
  return (f"config: --resume of {paths.as_str(workdir)} changes fields its checkpoint (step "
          f"{step}) was trained with: {listed}. A resumed run keeps its algorithm, optimizer, "
          f"model, data and seed (only {', '.join(RESUMABLE)} may change): resume with the "
          f"checkpoint's values, or start a new run in another --workdir")


def record_start(workdir, cfg, start: Start, *, config_json: str) -> None:
  """Appends this start to config.history.jsonl, then writes config.json (both atomic)."""
  entry = {"time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": socket.gethostname(),
           "resumed_from_step": start.step,
           "changes": {c.field: [c.old, c.new] for c in start.changes},
           "config": as_record(cfg)}
  history = paths.resolve(workdir) / HISTORY
  paths.append_text(history, json.dumps(entry, sort_keys=True) + "\n")
  paths.write_text(paths.resolve(workdir) / CONFIG_JSON, config_json)
  for c in start.changes:
    print(f"[resume] config.{c.field}: {c.old!r} -> {c.new!r} (may change on a resume; "
          f"recorded in {history})", flush=True)
