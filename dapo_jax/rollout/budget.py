"""The sampler's KV cache in an HBM budget per chip: slots (dense) or pages (paged).

The dense cache is [L, slots, S, Kv, Hd] in the compute dtype, slots split over the mesh's
batch axes (data x fsdp) and KV heads over `tensor` when they divide it (else replicated, as
the sharding rules do). The paged pool [Kv, L, N, page, Hd] splits its pages the same way; its
slot count is the decode batch (rollout.num_slots over the hosts), not bounded by the cache.
"""
import jax
import jax.numpy as jnp

from dapo_jax import sharding

GiB = 1024 ** 3


def slot_bytes_per_chip(mcfg, *, max_len: int, tensor: int) -> int:
  """HBM one slot's K and V take on each chip that holds it (a page's: max_len = page)."""
  kv = mcfg.num_kv_heads
  split = tensor if kv % tensor == 0 else 1
  item = jnp.dtype(mcfg.dtype).itemsize
  return 2 * mcfg.num_layers * max_len * kv * mcfg.head_dim * item // split


def sampler_slots(*, num_slots: int, kv_cache_gib: float, group_size: int, mcfg, max_len: int,
                  mesh_shape, paged: bool = False, hosts: int = 1) -> int:
  """Decode slots of one host's sampler. Paged: num_slots / hosts (the decode batch; memory
  bounds admission, not the slots). Dense: num_slots when kv_cache_gib is 0, else at most
  num_slots and at most what kv_cache_gib GiB per chip holds, rounded down to a multiple of
  the batch shards."""
  if paged:
    return _paged_slots(num_slots, group_size, mesh_shape, hosts)
  if kv_cache_gib == 0:
    return num_slots
  shards = sharding.batch_shards(mesh_shape)
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


def _paged_slots(num_slots: int, group_size: int, mesh_shape, hosts: int) -> int:
  shards = sharding.batch_shards(mesh_shape)
  per_host = num_slots // hosts
  if num_slots % hosts or per_host % shards or per_host < group_size:
    raise ValueError(
        f"config.rollout.num_slots: {num_slots} concurrent sequences must split over the "
        f"{hosts} host(s) into a multiple of the {shards} batch shards per host, at least one "
        f"group of G={group_size} each (paged KV cache)")
  return per_host


def sampler_pages(*, kv_cache_gib: float, mcfg, max_len: int, page_size: int,
                  mesh_shape) -> int | None:
  """Pages of the paged pool that kv_cache_gib GiB per chip holds (over all batch shards);
  None when kv_cache_gib is 0 (the engine's default: every slot at max_len)."""
  if kv_cache_gib == 0:
    return None
  shards = sharding.batch_shards(mesh_shape)
  per_page = slot_bytes_per_chip(mcfg, max_len=page_size, tensor=mesh_shape["tensor"])
  per_shard = int(kv_cache_gib * GiB // per_page)
  pps = -(-max_len // page_size)
  if per_shard < pps + 1:
    raise ValueError(
        f"config.rollout.kv_cache_gib: {kv_cache_gib} GiB per chip holds {per_shard} pages of "
        f"{page_size} tokens ({per_page / 2**20:.2f} MiB each), fewer than one sequence of "
        f"{max_len} tokens ({pps} pages) plus the null page; raise the budget")
  return per_shard * shards


def build_sampler(cfg, model, mcfg, mesh):
  """The run's GroupSampler on `mesh` (one host's sampler), its slots and pages from the
  budget (rollout.kv_cache_gib, rollout.num_slots over the processes)."""
  from dapo_jax.rollout.sampler import make_sampler  # pylint: disable=import-outside-toplevel
  rollout = cfg.rollout
  if cfg.model.routing_replay and not mcfg.moe_layers:
    raise ValueError("config.model.routing_replay: the model has no MoE layer (a dense "
                     "checkpoint or num_experts = 0)")
  slots = sampler_slots(num_slots=rollout.num_slots, kv_cache_gib=rollout.kv_cache_gib,
                        group_size=rollout.group_size, mcfg=mcfg, max_len=cfg.seq_len,
                        mesh_shape=mesh.shape, paged=rollout.paged_kv, hosts=jax.process_count())
  pages = None
  if rollout.paged_kv:
    pages = sampler_pages(kv_cache_gib=rollout.kv_cache_gib, mcfg=mcfg, max_len=cfg.seq_len,
                          page_size=rollout.page_size, mesh_shape=mesh.shape)
  return make_sampler(model, num_slots=slots, max_prompt_len=cfg.task.max_prompt_len,
                      max_len=cfg.seq_len, mesh=mesh, paged_kv=rollout.paged_kv,
                      page_size=rollout.page_size, num_pages=pages,
                      steps_per_call=rollout.steps_per_call,
                      record_experts=cfg.model.routing_replay,
                      weight_dtype=rollout.weight_dtype)
