"""Device-side data of the rollout engine: prefixes, the decode state, and their shardings.

Slots are the batch rows of the decode state: sharded as the logical `batch` axis (data, fsdp),
KV heads as `kv_heads` (tensor), through dapo_jax.sharding's rules table; the rest replicated.
"""
import numbers

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from dapo_jax import sharding as sharding_lib
from dapo_jax.models import paged as paged_lib


@flax.struct.dataclass
class Prefix:
  """Result of prefilling Np prompts (Np = 1 for a JetStream request).

  cache: {"k", "v"} [L, Np, P, Kv, Hd] with P = the engine's max_prefill_length.
  logits_NpxV: next-token logits after each prompt (float32), sampled from at the first step.
  lengths_Np: prompt lengths (int32).
  expert_ids_NpxPxLxK: the experts of each prompt token per MoE layer (int16; routing replay,
    `Engine(record_experts=True)`), None when not recorded.
  """
  cache: dict
  logits_NpxV: jax.Array
  lengths_Np: jax.Array
  expert_ids_NpxPxLxK: jax.Array | None = None


@flax.struct.dataclass
class DecodeState:
  """Everything a generate step transforms; B = number of slots.

  cache: {"k", "v"} [L, B, S, Kv, Hd], S = max_len (prompt + response); or a page pool
    [Kv, L, N, page, Hd] (`models.paged`, the rows' page tables kept by the host).
  logits_BxV: the slot's next-token logits (the sample at step t is drawn from these).
  positions_B: where the next sampled token's K/V goes (= prompt length + tokens generated).
  gen_len_B / max_new_B: tokens generated so far / allowed (min(max_new_tokens, S - prompt)).
  active_B: the slot holds an unfinished sample.
  keys_Bx2: per-sample PRNG key data, fold_in(fold_in(root, prompt id), sample id); the key of
    token t is fold_in(that, t), so a sample's draws never depend on the slot it runs in.
  root_key_2, temperature, top_p, top_k, eos_E: the call's sampling parameters (traced, so a
    change never recompiles).
  """
  cache: dict
  logits_BxV: jax.Array
  positions_B: jax.Array
  gen_len_B: jax.Array
  max_new_B: jax.Array
  active_B: jax.Array
  keys_Bx2: jax.Array
  root_key_2: jax.Array
  temperature: jax.Array
  top_p: jax.Array
  top_k: jax.Array
  eos_E: jax.Array


# Fixed so the key data shape ([2] uint32) never depends on the jax_default_prng_impl flag.
PRNG_IMPL = "threefry2x32"


def root_key_data(seed: int) -> jax.Array:
  return jax.random.key_data(jax.random.key(seed, impl=PRNG_IMPL))


def wrap_key(key_data):
  return jax.random.wrap_key_data(key_data, impl=PRNG_IMPL)


def empty_decode_state(*, cache, num_slots: int, vocab_size: int, root_key_2, temperature,
                       top_p, top_k, eos_E) -> DecodeState:
  """A decode state with every slot free (cache contents are never read before written)."""
  b = num_slots
  return DecodeState(
      cache=cache,
      logits_BxV=jnp.zeros((b, vocab_size), jnp.float32),
      positions_B=jnp.zeros((b,), jnp.int32),
      gen_len_B=jnp.zeros((b,), jnp.int32),
      max_new_B=jnp.zeros((b,), jnp.int32),
      active_B=jnp.zeros((b,), jnp.bool_),
      keys_Bx2=jnp.zeros((b, 2), jnp.uint32),
      root_key_2=root_key_2, temperature=temperature, top_p=top_p, top_k=top_k, eos_E=eos_E)


def decode_state_shardings(mesh, *, cache_shape, vocab_size: int,
                           num_slots: int | None = None) -> DecodeState:
  """NamedShardings for every field of a DecodeState (same pytree), from the rules table.
  num_slots: set for a page pool (cache_shape [Kv, L, N, page, Hd]); None = dense cache."""
  if num_slots is None:
    b, cache_s = cache_shape[1], sharding_lib.cache_sharding(mesh, cache_shape)
  else:
    b, cache_s = num_slots, paged_lib.pages_sharding(mesh, cache_shape)

  def rows(*shape):
    names = ("batch",) + (None,) * (len(shape) - 1)
    return sharding_lib.logical_to_mesh_sharding(names, mesh, shape=shape)

  rep = NamedSharding(mesh, P())
  return DecodeState(
      cache={"k": cache_s, "v": cache_s}, logits_BxV=rows(b, vocab_size), positions_B=rows(b),
      gen_len_B=rows(b), max_new_B=rows(b), active_B=rows(b), keys_Bx2=rows(b, 2),
      root_key_2=rep, temperature=rep, top_p=rep, top_k=rep, eos_E=rep)


def prefix_shardings(mesh, *, cache_shape, record_experts: bool = False) -> Prefix:
  """Prefixes are replicated over the batch axes, so any slot can take any prefix locally."""
  names = (sharding_lib.CACHE_AXES[0], None) + tuple(sharding_lib.CACHE_AXES[2:])
  cache_s = sharding_lib.logical_to_mesh_sharding(names, mesh, shape=cache_shape)
  rep = NamedSharding(mesh, P())
  return Prefix(cache={"k": cache_s, "v": cache_s}, logits_NpxV=rep, lengths_Np=rep,
                expert_ids_NpxPxLxK=rep if record_experts else None)


def _positive_int(value, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
    raise ValueError(f"{name}: must be a positive int, got {value!r}")
  return int(value)


def check_engine_sizes(cfg, num_slots, max_prompt_len, max_len, steps_per_call) -> tuple:
  """The Engine's size arguments, checked: (num_slots, max_prompt_len, max_len, steps)."""
  sizes = tuple(_positive_int(v, name) for v, name in (
      (num_slots, "num_slots"), (max_prompt_len, "max_prompt_len"), (max_len, "max_len"),
      (steps_per_call, "steps_per_call")))
  if sizes[1] >= sizes[2]:
    raise ValueError(f"max_len: must exceed max_prompt_len ({max_prompt_len}) to leave room "
                     f"for a response, got {max_len}")
  if sizes[2] > cfg.max_position_embeddings:
    raise ValueError(f"max_len: {max_len} exceeds the model's max_position_embeddings "
                     f"({cfg.max_position_embeddings})")
  return sizes
