"""How many concurrent sequences the sampler's dense KV cache holds in an HBM budget per chip.

The cache is [L, slots, S, Kv, Hd] in the compute dtype, slots split over the mesh's batch axes
(data x fsdp) and KV heads over `tensor` when they divide it (else replicated, as the sharding
rules do). A paged cache (issue 11) would size pages instead of slots from the same budget.
"""
import jax.numpy as jnp

GiB = 1024 ** 3


def slot_bytes_per_chip(mcfg, *, max_len: int, tensor: int) -> int:
  """HBM one slot's K and V take on each chip that holds it."""
  kv = mcfg.num_kv_heads
  split = tensor if kv % tensor == 0 else 1
  item = jnp.dtype(mcfg.dtype).itemsize
  return 2 * mcfg.num_layers * max_len * kv * mcfg.head_dim * item // split


def sampler_slots(*, num_slots: int, kv_cache_gib: float, group_size: int, mcfg, max_len: int,
                  mesh_shape) -> int:
  """Decode slots: num_slots when kv_cache_gib is 0, else at most num_slots and at most what
  kv_cache_gib GiB per chip holds, rounded down to a multiple of the batch shards."""
  if kv_cache_gib == 0:
    return num_slots
  shards = mesh_shape["data"] * mesh_shape["fsdp"]
  per_slot = slot_bytes_per_chip(mcfg, max_len=max_len, tensor=mesh_shape["tensor"])
  per_shard = int(kv_cache_gib * GiB // per_slot)
  slots = min(num_slots, per_shard * shards) // shards * shards
  if slots < group_size:
    raise ValueError(
        f"config.rollout.kv_cache_gib: {kv_cache_gib} GiB per chip holds {per_shard} slot(s) "
        f"per batch shard ({per_slot / GiB:.2f} GiB each at {max_len} tokens) x {shards} "
        f"shards = {slots}, fewer than one group of G={group_size}; raise the budget or "
        "config.mesh.tensor")
  return slots
