"""Typed, validated run configuration.

Configs are `ml_collections.ConfigDict`s at the edges (configs/*.py, command-line overrides) and
frozen dataclasses inside: `parse(cfg)` checks that every section has exactly the known keys (an
unknown or missing key is an error naming it, never a silent default), converts them, and checks
ranges and cross-field constraints before anything is compiled. The sections themselves are in
`config_sections.py`.
"""
import dataclasses
import typing
from typing import Any, Mapping

from dapo_jax.config import checks
from dapo_jax.config.sections import (  # noqa: F401  (re-exported: config.Config etc.)
    AlgoCfg, CheckpointCfg, Config, DistributedCfg, EvalCfg, LogCfg, LoraCfg, MeshCfg, ModelCfg,
    ModeParams, OptimCfg, RolloutCfg, TaskCfg, TrainCfg, WarmStartCfg)
from dapo_jax.core import losses as core_losses


def _convert(section: str, cls, raw: Mapping[str, Any]):
  if not isinstance(raw, Mapping) and not hasattr(raw, "to_dict"):
    raise ValueError(f"config.{section}: expected a section (ConfigDict), got {type(raw).__name__}")
  raw = raw.to_dict() if hasattr(raw, "to_dict") else dict(raw)
  hints = typing.get_type_hints(cls)
  names = [f.name for f in dataclasses.fields(cls)]
  _exact_keys(f"config.{section}", raw, names, "key(s)")
  out = {}
  for name in names:
    v, t = raw[name], hints[name]
    where = f"config.{section}.{name}"
    if type(None) in typing.get_args(t):  # `X | None`: None allowed, else checked as X
      if v is None:
        out[name] = v
        continue
      t = next(a for a in typing.get_args(t) if a is not type(None))
    if t is bool:
      if not isinstance(v, bool):
        raise ValueError(f"{where}: expected a bool, got {v!r}")
    elif t is int:
      if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{where}: expected an int, got {v!r}")
    elif t is float:
      if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"{where}: expected a number, got {v!r}")
      v = float(v)
    elif t is str:
      if not isinstance(v, str):
        raise ValueError(f"{where}: expected a string, got {v!r}")
    elif t == ModeParams:
      v = _mode_params(where, v)
    out[name] = v
  return cls(**out)


def _exact_keys(where: str, v, known, what: str):
  """`v` a mapping with exactly the keys `known`; errors name `where` and list `known`."""
  if not isinstance(v, Mapping):
    raise ValueError(f"{where}: expected a section of {what}, got {v!r}")
  unknown, missing = sorted(set(v) - set(known)), sorted(set(known) - set(v))
  if unknown:
    raise ValueError(f"{where}: unknown {what} {unknown}; known: {list(known)}")
  if missing:
    raise ValueError(f"{where}: missing {what} {missing}")


def _mode_params(where: str, v) -> ModeParams:
  """algo.mode_params: a section per mode of core.loss_modes.MODE_KNOBS holding exactly its
  knobs, each a number or None."""
  knobs = core_losses.loss_modes.MODE_KNOBS
  _exact_keys(where, v, knobs, "loss mode(s)")
  out = []
  for mode, section in sorted(v.items()):
    _exact_keys(f"{where}.{mode}", section, knobs[mode], "knob(s)")
    for k, x in section.items():
      if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float))):
        raise ValueError(f"{where}.{mode}.{k}: expected a number or None, got {x!r}")
    out.append((mode, tuple(sorted((k, None if x is None else float(x))
                                   for k, x in section.items()))))
  return tuple(out)


_SECTIONS = {f.name: f.type for f in dataclasses.fields(Config) if f.name != "seed"}


def parse(cfg, overrides=()) -> Config:
  """ConfigDict (or nested dict) -> validated Config. Raises ValueError naming the field.
  `overrides`: the dotted fields set on the command line (`--config.model.num_layers=4` gives
  "model.num_layers"); those the run would ignore are refused (checks.check_overrides)."""
  raw = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
  unknown = sorted(set(raw) - set(_SECTIONS) - {"seed"})
  if unknown:
    raise ValueError(f"config: unknown top-level key(s) {unknown}; known: "
                     f"{['seed', *_SECTIONS]}")
  for name in ["seed", *_SECTIONS]:
    if name not in raw:
      raise ValueError(f"config: missing section {name!r}")
  if isinstance(raw["seed"], bool) or not isinstance(raw["seed"], int):
    raise ValueError(f"config.seed: expected an int, got {raw['seed']!r}")
  hints = typing.get_type_hints(Config)
  sections = {name: _convert(name, hints[name], raw[name]) for name in _SECTIONS}
  c = Config(seed=raw["seed"], **sections)
  checks.validate(c)
  checks.check_overrides(c, overrides)
  return c
