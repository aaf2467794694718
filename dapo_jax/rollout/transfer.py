"""Trainer -> sampler weight transfer, device to device in the sampler's dtype.

One process: cast where the weights are, then `jax.device_put` onto the sampler's shardings.
Several processes (a pod, or the 2-process CPU test): the sampler on each host is its slice of
one host-major global sampler mesh, filled by one jitted cast + reshard and then wrapped per
host. Weights never pass through host memory.
"""
import functools

import jax
import numpy as np
from jax.sharding import NamedSharding


@functools.partial(jax.jit, static_argnums=(1,))
def _cast_tree(tree, dtype):
  return jax.tree.map(lambda x: x.astype(dtype), tree)


def transfer_params(tree, shardings, dtype):
  """Weights -> `shardings` in `dtype`, device to device: cast where they are (f32 -> bf16
  moves half the bytes), then resharded. Arrays spanning several processes (the trainer's on a
  pod) take `_across_hosts`; host arrays (pure dicts of numpy) are simply put."""
  if all(getattr(x, "is_fully_addressable", True) for x in jax.tree.leaves(tree)):
    # A leaf already in `dtype` may come back from the cast as the caller's own array (jit
    # forwards unchanged inputs): copy those, so a trainer donating its buffers cannot delete
    # the sampler's; the others are fresh and move without an extra copy.
    return jax.tree.map(lambda c, x, s: jax.device_put(c, s, may_alias=x.dtype != dtype),
                        _cast_tree(tree, dtype), tree, shardings)
  return _across_hosts(tree, shardings, dtype)


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
  from its own devices in order, see setup.build_sampler_mesh)."""
  grids = []
  for p in range(jax.process_count()):
    devs = [d for d in jax.devices() if d.process_index == p]
    if len(devs) != local_mesh.devices.size:
      raise ValueError(f"sampler mesh: process {p} has {len(devs)} devices, this one's mesh "
                       f"{local_mesh.devices.size}; every host needs the same sampler mesh")
    grids.append(np.array(devs, dtype=object).reshape(local_mesh.devices.shape))
  if not (grids[jax.process_index()] == local_mesh.devices).all():
    raise ValueError("sampler mesh: with several processes it must hold this process's "
                     "devices in jax.local_devices() order (setup.build_sampler_mesh)")
  return jax.sharding.Mesh(np.stack(grids), ("hosts", *local_mesh.axis_names),
                           axis_types=(jax.sharding.AxisType.Auto,) * (1 + local_mesh.devices.ndim))
