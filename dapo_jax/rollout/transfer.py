"""Trainer -> sampler weight transfer, device to device in the sampler's dtype.

One process: cast where the weights are, then `jax.device_put` onto the sampler's shardings
(its devices may be the trainer's or others: train/placement.py). Several processes (a pod, or
the 2-process CPU test), colocated: the sampler on each host is its slice of one host-major
global sampler mesh, filled by one jitted cast + reshard and then wrapped per host. Several
processes, split: one jitted cast + all-gather to the sampler's tensor layout on the trainer's
devices, then each host copies the shards its own sampler devices need from its own trainer
devices. Weights never pass through host memory.
"""
import functools

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax import sharding as sharding_lib


def param_shardings(model, mesh):
  """NamedShardings of the model's nnx.Param leaves on `mesh` (the logical-axis rules table)."""
  return nnx.filter_state(sharding_lib.model_shardings(model, mesh), nnx.Param)


def match_tree(params, like):
  """`params` (an nnx.Param state or a pure dict of the same tree, on any mesh) checked leaf by
  leaf against `like` (names and shapes) and returned in `like`'s tree structure."""
  want, treedef = jax.tree_util.tree_flatten_with_path(like)
  got = {_name(k): x for k, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  names = [_name(k) for k, _ in want]
  if set(got) != set(names):
    raise ValueError(f"params: tree does not match the engine's; missing "
                     f"{sorted(set(names) - set(got))[:5]}, unexpected "
                     f"{sorted(set(got) - set(names))[:5]}")
  for name, (_, w) in zip(names, want):
    shape = tuple(getattr(got[name], "shape", ()))
    if shape != tuple(w.shape):
      raise ValueError(f"params{name}: shape {shape} does not match the engine's "
                       f"{tuple(w.shape)}")
  return jax.tree.unflatten(treedef, [got[n] for n in names])


def _name(path) -> str:
  """A leaf's path as text, without nnx's trailing `.value` (so pure dicts match too)."""
  name = jax.tree_util.keystr(path)
  return name[:-len(".value")] if name.endswith(".value") else name


@functools.partial(jax.jit, static_argnums=(1,))
def _cast_tree(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype), tree)


def transfer_params(tree, shardings, dtype):
  """Weights -> `shardings` in `dtype`, device to device: cast where they are (f32 -> bf16
  moves half the bytes), then resharded. Arrays spanning several processes (the trainer's on a
  pod) take `_across_hosts`; host arrays (pure dicts of numpy) are simply put."""
  leaves = jax.tree.leaves(tree)
  if all(getattr(x, "is_fully_addressable", True) for x in leaves):
    # A leaf already in `dtype` may come back from the cast as the caller's own array (jit
    # forwards unchanged inputs): copy those, so a trainer donating its buffers cannot delete
    # the sampler's; the others are fresh and move without an extra copy.
    return jax.tree.map(lambda c, x, s: jax.device_put(c, s, may_alias=x.dtype != dtype),
                        _cast_tree(tree, dtype), tree, shardings)
  target = set(jax.tree.leaves(shardings)[0].mesh.devices.flat)
  if target & set(leaves[0].sharding.device_set):
    return _across_hosts(tree, shardings, dtype)
  return _across_placements(tree, shardings, dtype)


def tensor_only(spec) -> PartitionSpec:
  """The spec with every mesh axis but `tensor` dropped (replicated over the batch axes)."""
  keep = lambda a: a if a == "tensor" or (isinstance(a, tuple) and "tensor" in a) else None
  return PartitionSpec(*("tensor" if keep(a) else None for a in spec))


def _across_placements(tree, shardings, dtype):
  """Multi-process split placement: the trainer's devices first gather the cast weights into
  the sampler's tensor layout (an all-gather over the trainer's mesh); then each process
  copies, device to device, the shard each of its sampler devices holds from one of its own
  trainer devices (the trainer's tensor axis has the sampler's size, config.mesh.tensor)."""
  tmesh = jax.tree.leaves(tree)[0].sharding.mesh
  staged_sh = jax.tree.map(lambda s: NamedSharding(tmesh, tensor_only(s.spec)), shardings)
  staged = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(dtype), t),
                   out_shardings=staged_sh)(tree)
  return jax.tree.map(_copy_local_shards, staged, shardings)


def _copy_local_shards(x, target: NamedSharding):
  """`x` (replicated over the trainer's batch axes) as `target` on this host's sampler devices."""
  by_index = {}
  for shard in x.addressable_shards:
    by_index.setdefault(_key(shard.index), shard.data)
  arrays = []
  for dev, index in target.addressable_devices_indices_map(x.shape).items():
    src = by_index.get(_key(index))
    if src is None:
      raise ValueError(f"weight sync: this process's trainer devices hold no shard {index} of a "
                       f"{x.shape} weight; with a split placement each host's trainer devices "
                       "need every tensor shard (config.mesh.tensor <= trainer devices per host)")
    arrays.append(jax.device_put(src, dev))
  return jax.make_array_from_single_device_arrays(x.shape, target, arrays)


def _key(index) -> tuple:
  return tuple((s.start, s.stop) for s in index)


def _across_hosts(tree, shardings, dtype):
  """Multi-process: one jit casts and lays the weights out on the host-major global sampler
  mesh (replicated over hosts: the all-gather runs over ICI/DCN, never through host memory);
  each process then wraps its own devices' shards as this engine's arrays (no copy)."""
  local_mesh = jax.tree.leaves(shardings)[0].mesh
  gmesh = _host_major_mesh(local_mesh)
  gsh = jax.tree.map(lambda s: NamedSharding(gmesh, s.spec), shardings)
  full = jax.jit(lambda t: jax.tree.map(lambda x: x.astype(dtype), t), out_shardings=gsh)(tree)
  return jax.tree.map(
      lambda x, s: jax.make_array_from_single_device_arrays(
          x.shape, s, [shard.data for shard in x.addressable_shards]), full, shardings)


def _host_major_mesh(local_mesh):
  """Every process's local mesh stacked on a leading `hosts` axis (each built as this one is:
  from its own devices in order, see train.placement.build_sampler_mesh)."""
  grids = []
  for p in range(jax.process_count()):
    devs = [d for d in jax.devices() if d.process_index == p]
    if len(devs) != local_mesh.devices.size:
      raise ValueError(f"sampler mesh: process {p} has {len(devs)} devices, this one's mesh "
                       f"{local_mesh.devices.size}; every host needs the same sampler mesh")
    grids.append(np.array(devs, dtype=object).reshape(local_mesh.devices.shape))
  if not (grids[jax.process_index()] == local_mesh.devices).all():
    raise ValueError("sampler mesh: with several processes it must hold this process's "
                     "devices in jax.local_devices() order (train.placement.build_sampler_mesh)")
  return jax.sharding.Mesh(np.stack(grids), ("hosts", *local_mesh.axis_names),
                           axis_types=(jax.sharding.AxisType.Auto,) * (1 + local_mesh.devices.ndim))
