"""A LoRA run's policy (config.lora.rank > 0): the base it adapts, on disk and checked.

The adapters train; the base weights stay frozen. A checkpoint holds the adapters and their
optimizer state only, with a reference to the base (`BaseRef`: an HF directory and a checksum of
its weights as loaded), so the base must be on disk as an HF checkpoint: the configured
model.hf_path when the run loads one and does not warm-start it, else `<workdir>/base`, written
once at the run's start (a fresh init or a warm-started policy) and loaded from there on
--resume. PEFT's adapter_config.json names the same directory.
"""
import dataclasses
import os

import jax
from flax import nnx

from dapo_jax.config import Config
from dapo_jax.models import hf_io, lora
from dapo_jax.refusals import Refusal
from dapo_jax.workdir import paths


@dataclasses.dataclass(frozen=True)
class BaseRef:
  path: str                   # the base's HF directory
  checksum: str               # lora.checksum of the frozen state as loaded
  written: bool               # written by this run (<workdir>/base), not the configured one


def base_dir(cfg: Config, workdir: str, resolve) -> tuple[str, bool]:
  """(the base's HF directory, whether this run writes it)."""
  if cfg.model.source == "hf" and not cfg.warm_start.steps:
    return resolve(cfg.model.hf_path), False
  return os.path.join(workdir, "base"), True


def build_config(cfg: Config, workdir: str, resolve, *, resume: bool) -> tuple[Config, bool]:
  """(the config the policy is built from, whether that policy is a finished base): on
  --resume, a base this run wrote earlier is loaded as an HF checkpoint and neither
  re-initialised nor warm-started again."""
  path, written = base_dir(cfg, workdir, resolve)
  if not (resume and cfg.lora.rank and written
          and (paths.resolve(path) / "config.json").exists()):  # local or a bucket
    return cfg, False
  model = dataclasses.replace(cfg.model, source="hf", hf_path=path)
  return dataclasses.replace(cfg, model=model), True


def attach(cfg: Config, graphdef, params, mesh, *, workdir: str, resolve, tokenizer,
           model_config, reloaded: bool):
  """(graphdef, trainable params, frozen base or None, BaseRef or None): under LoRA the
  adapters are added (lora.attach) and a base this run owns is written first when new."""
  if not cfg.lora.rank:
    return graphdef, params, None, None
  model = nnx.merge(graphdef, params)
  path, written = base_dir(cfg, workdir, resolve)
  if written and not reloaded:
    hf_io.save_pretrained(model, model_config, path, overwrite=True)
    if jax.process_index() == 0:
      with paths.staged_dir(path) as local:
        tokenizer.save_pretrained(local)
  lo = cfg.lora
  lora.attach(model, rank=lo.rank, alpha=lo.alpha, targets=lo.targets, seed=cfg.seed, mesh=mesh)
  graphdef, trainable, frozen = lora.split(model)
  return graphdef, trainable, frozen, BaseRef(path, lora.checksum(frozen), written)


def check_restored(meta: dict, ref: BaseRef | None) -> None:
  """A checkpoint's base reference against the base this run loaded (Refusal naming both)."""
  saved = meta.get("lora_base")
  if ref is None and saved is None:
    return
  if ref is None or saved is None:
    raise Refusal(f"--resume: the checkpoint was saved {'with' if saved else 'without'} LoRA "
                  f"adapters and this run's config.lora.rank is "
                  f"{'0' if ref is None else 'set'}; resume with the config it was saved with")
  if saved["checksum"] != ref.checksum:
    raise Refusal(f"--resume: the base weights at {ref.path} differ from those the "
                  f"checkpoint's adapters were trained on ({saved['path']}, checksum "
                  f"{saved['checksum'][:12]} vs {ref.checksum[:12]} now)")
