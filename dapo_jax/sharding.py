"""Device meshes and the one table that maps logical axis names to mesh axes.

Parameters carry logical names (`vocab`, `embed`, `heads`, `kv_heads`, `head_dim`, `mlp`,
`layers`, `norm`); activations use `batch`, `seq` and `cache_seq`. Swapping the rules table
changes the parallelism, not the model code.

The trainer's mesh has a `context` axis when `mesh.context` > 1 (context parallelism): each
row's tokens (`seq`) split over it, and the parameters' `embed` dimension over fsdp x context,
so the chips of a context group still share the train state as FSDP does.
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# Logical names of one KV-cache array [L, B, S, Kv, Hd] (the dense decode cache and prefixes).
CACHE_AXES = ("layers", "batch", "cache_seq", "kv_heads", "head_dim")

CONTEXT = "context"  # the mesh axis that splits each row's tokens (context parallelism)

# Logical name -> mesh axis (or tuple of axes, or None = replicated).
DEFAULT_RULES: tuple[tuple[str, str | tuple[str, ...] | None], ...] = (
    ("batch", ("data", "fsdp")),
    ("vocab", "tensor"),
    ("seq", CONTEXT),
    ("embed", ("fsdp", CONTEXT)),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("expert", "fsdp"),  # MoE experts [E, ...]: split over fsdp (their channels over tensor)
    ("head_dim", None),
    ("layers", None),
    ("norm", None),
    ("cache_seq", None),
    ("lora_rank", None),  # LoRA factors' rank dimension (models/lora.py)
)


def make_mesh(axis_sizes: Mapping[str, int], devices: Sequence[jax.Device] | None = None
              ) -> Mesh:
  """Mesh with the given axis names and sizes, in order; one size may be -1 (= the rest)."""
  devices = list(jax.devices() if devices is None else devices)
  if not axis_sizes:
    raise ValueError("make_mesh: axis_sizes is empty")
  names, sizes = list(axis_sizes), list(axis_sizes.values())
  for name, size in zip(names, sizes):
    if isinstance(size, bool) or not isinstance(size, int) or (size <= 0 and size != -1):
      raise ValueError(f"make_mesh: axis {name!r} size must be a positive int or -1, "
                       f"got {size!r}")
  if sizes.count(-1) > 1:
    raise ValueError(f"make_mesh: at most one axis may be -1, got {dict(axis_sizes)}")
  known = math.prod(s for s in sizes if s != -1)
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"make_mesh: {len(devices)} devices are not divisible by the fixed "
                       f"axis sizes {dict(axis_sizes)} (product {known})")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"make_mesh: axis sizes {dict(zip(names, sizes))} need "
                     f"{math.prod(sizes)} devices, have {len(devices)}")
  grid = np.array(devices, dtype=object).reshape(sizes)
  return Mesh(grid, tuple(names),
              axis_types=(jax.sharding.AxisType.Auto,) * len(names))


def logical_to_mesh_sharding(names: Sequence[str | None], mesh: Mesh,
                             rules=DEFAULT_RULES, *, shape: Sequence[int] | None = None
                             ) -> NamedSharding:
  """NamedSharding for an array whose dimensions carry these logical names.

  Mesh axes that the mesh lacks, that an earlier dimension already uses, or (when `shape` is
  given) that do not divide the dimension are dropped: that dimension is then replicated over
  them (e.g. 2 KV heads on a tensor axis of 4).
  """
  table = dict(rules)
  if shape is not None and len(shape) != len(names):
    raise ValueError(f"logical names {tuple(names)} do not match shape {tuple(shape)}")
  used, spec = set(), []
  for i, name in enumerate(names):
    if name is not None and name not in table:
      raise ValueError(f"logical axis {name!r} has no entry in the rules table "
                       f"(known: {sorted(table)})")
    target = table.get(name) if name is not None else None
    axes = (target,) if isinstance(target, str) else tuple(target or ())
    kept, size = [], 1
    for ax in axes:
      if ax not in mesh.shape or ax in used:
        continue
      if shape is not None and shape[i] % (size * mesh.shape[ax]):
        continue
      kept.append(ax)
      size *= mesh.shape[ax]
    used.update(kept)
    spec.append(None if not kept else kept[0] if len(kept) == 1 else tuple(kept))
  return NamedSharding(mesh, PartitionSpec(*spec))


def _is_var(x):
  return isinstance(x, nnx.Variable)


def model_shardings(model, mesh: Mesh, rules=DEFAULT_RULES):
  """nnx.State of NamedSharding, same tree as nnx.state(model) (abstract models work too)."""
  def to_sharding(v):
    axes = v.get_metadata().get("logical_axes")
    value = v.get_value()
    if axes is None:
      return v.replace(NamedSharding(mesh, PartitionSpec()))
    return v.replace(logical_to_mesh_sharding(axes, mesh, rules, shape=value.shape))

  return jax.tree.map(to_sharding, nnx.state(model), is_leaf=_is_var)


def context_size(mesh) -> int:
  """Shards of each row's tokens: the size of the mesh's `context` axis (1 without one)."""
  return 1 if mesh is None else dict(mesh.shape).get(CONTEXT, 1)


def constrain_tokens(x, mesh, names=("batch", "seq"), rules=DEFAULT_RULES):
  """x [B, T, ...] laid out with T over the mesh's context axis (rows over the batch axes); x
  itself when the mesh has no context axis (nothing is constrained then: the layout is GSPMD's,
  as without context parallelism)."""
  if context_size(mesh) == 1:
    return x
  names = tuple(names) + (None,) * (x.ndim - len(names))
  return jax.lax.with_sharding_constraint(
      x, logical_to_mesh_sharding(names, mesh, rules, shape=x.shape))


def batch_shards(mesh_or_shape, rules=DEFAULT_RULES) -> int:
  """Shards of the logical `batch` axis: the product of the mesh axes the rules map it to that
  the mesh has (data x fsdp with the default table). Takes a Mesh or its shape mapping."""
  shape = getattr(mesh_or_shape, "shape", mesh_or_shape)
  target = dict(rules)["batch"]
  axes = (target,) if isinstance(target, str) else tuple(target or ())
  return math.prod(shape.get(ax, 1) for ax in axes)


def data_sharding(mesh: Mesh, rules=DEFAULT_RULES) -> NamedSharding:
  """Sharding of [B, ...] batch arrays: B over the mesh axes of logical `batch`."""
  return logical_to_mesh_sharding(("batch",), mesh, rules)


def cache_sharding(mesh: Mesh, cache_shape: Sequence[int], rules=DEFAULT_RULES
                   ) -> NamedSharding:
  """Sharding of one KV-cache array [L, B, S, Kv, Hd] (slots over `batch`)."""
  return logical_to_mesh_sharding(CACHE_AXES, mesh, rules, shape=cache_shape)
