"""The sampler's device functions, pure and jitted by `engine.Engine` (and by `dapo_jax.aot`,
which compiles them for a pod): prefill, insert, one decode step, a chunk of decode steps
(a while loop over `step`), JetStream's result step, and the empty decode state.

Shapes are fixed by the arguments; params and sampling parameters are traced, so new weights
or refilled slots never recompile.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models import qwen2
from dapo_jax.rollout import sampling, state as state_lib
from dapo_jax.rollout.state import DecodeState, Prefix

LAYER_LOOPS = ("auto", "unrolled", "scan")


def step(graphdef, params, rest, st: DecodeState, layer_params=None):
  """Samples one token in every slot, then runs the decode step for it (inactive slots idle).
  The cache may be stacked or per layer; layer_params: see `Qwen2.decode_step`."""
  keys_B = jax.vmap(lambda kd, t: jax.random.fold_in(state_lib.wrap_key(kd), t))(
      st.keys_Bx2, st.gen_len_B)
  tok_B, logp_B = sampling.sample_tokens(
      st.logits_BxV, keys_B, temperature=st.temperature, top_p=st.top_p, top_k=st.top_k)
  valid_B = st.active_B
  tok_B = jnp.where(valid_B, tok_B, 0)
  logp_B = jnp.where(valid_B, logp_B, 0.0)
  gen_len_B = st.gen_len_B + valid_B.astype(jnp.int32)
  hit_eos_B = jnp.any(tok_B[:, None] == st.eos_E[None, :], axis=-1)
  active_B = valid_B & ~hit_eos_B & (gen_len_B < st.max_new_B)
  # A slot that just finished still runs this decode step (rows are computed together); its
  # position is clamped so a free slot never writes outside the cache.
  max_pos = jax.tree.leaves(st.cache["k"])[0].shape[-3] - 1
  model = nnx.merge(graphdef, params, rest)
  logits_BxV, cache = model.decode_step(tok_B, jnp.minimum(st.positions_B, max_pos), st.cache,
                                        layer_params=layer_params)
  new = st.replace(
      cache=cache, logits_BxV=logits_BxV.astype(jnp.float32),
      positions_B=st.positions_B + active_B.astype(jnp.int32), gen_len_B=gen_len_B,
      active_B=active_B)
  return new, tok_B, logp_B, valid_B


def generate_chunk(graphdef, params, rest, st: DecodeState, stop_on_finish, *, max_steps: int,
                    per_layer: bool):
  """Runs up to max_steps steps; stops early once every slot is free, or (when stop_on_finish)
  as soon as any sample finishes, so the host can refill that slot at once.
  per_layer (`per_layer_decode`): carry the cache per layer and per-layer weights sliced once
  before the loop (XLA:CPU would otherwise copy every stacked weight and a layer of cache at
  each step); else the stacked cache is scanned over in place (one buffer: accelerators)."""
  b = st.active_B.shape[0]
  layer_params = None
  if per_layer:
    layer_params = nnx.merge(graphdef, params, rest).layer_params()
    ks, vs = qwen2.split_cache(st.cache)
    st = st.replace(cache={"k": tuple(ks), "v": tuple(vs)})

  def cond(carry):
    i, s, _, _, finished = carry
    return (i < max_steps) & jnp.any(s.active_B) & ~(stop_on_finish & finished)

  def body(carry):
    i, s, tok_BxK, logp_BxK, _ = carry
    s, tok_B, logp_B, valid_B = step(graphdef, params, rest, s, layer_params)
    tok_BxK = jax.lax.dynamic_update_slice(tok_BxK, tok_B[:, None], (0, i))
    logp_BxK = jax.lax.dynamic_update_slice(logp_BxK, logp_B[:, None], (0, i))
    return i + 1, s, tok_BxK, logp_BxK, jnp.any(valid_B & ~s.active_B)

  init = (jnp.int32(0), st, jnp.zeros((b, max_steps), jnp.int32),
          jnp.zeros((b, max_steps), jnp.float32), jnp.bool_(False))
  steps, st, tok_BxK, logp_BxK, _ = jax.lax.while_loop(cond, body, init)
  if per_layer:
    st = st.replace(cache=qwen2.stack_cache(st.cache["k"], st.cache["v"]))
  return st, dict(tokens_BxK=tok_BxK, logp_BxK=logp_BxK, steps=steps, gen_len_B=st.gen_len_B,
                  active_B=st.active_B)


def per_layer_decode(mesh, layer_loop: str = "auto") -> bool:
  """Whether the decode loop carries the cache per layer: layer_loop "unrolled" / "scan", or
  "auto" = unrolled on CPU meshes (see `generate_chunk`), scanned on accelerators."""
  if layer_loop not in LAYER_LOOPS:
    raise ValueError(f"layer_loop: must be one of {LAYER_LOOPS}, got {layer_loop!r}")
  if layer_loop == "auto":
    return mesh.devices.flat[0].platform == "cpu"
  return layer_loop == "unrolled"


def prefill(graphdef, params, rest, tokens_NxP, lengths_N) -> Prefix:
  model = nnx.merge(graphdef, params, rest)
  logits_NxV, cache = model.prefill(tokens_NxP, lengths_N)
  return Prefix(cache=cache, logits_NpxV=logits_NxV.astype(jnp.float32), lengths_Np=lengths_N)


def insert(prefix: Prefix, st: DecodeState, src_K, slot_K, prompt_id_K, sample_id_K, max_new_K):
  """Copies prefix rows src_K into slots slot_K (an index equal to the slot count is a no-op)."""
  p = prefix.cache["k"].shape[2]
  s_len = st.cache["k"].shape[2]
  cache = {name: st.cache[name].at[:, slot_K, :p].set(prefix.cache[name][:, src_K], mode="drop")
           for name in ("k", "v")}
  len_K = prefix.lengths_Np[src_K]
  root = state_lib.wrap_key(st.root_key_2)
  keys_Kx2 = jax.vmap(lambda a, b: jax.random.key_data(
      jax.random.fold_in(jax.random.fold_in(root, a), b)))(prompt_id_K, sample_id_K)

  def put(x, v):
    return x.at[slot_K].set(v, mode="drop")

  return st.replace(
      cache=cache,
      logits_BxV=put(st.logits_BxV, prefix.logits_NpxV[src_K]),
      positions_B=put(st.positions_B, len_K),
      gen_len_B=put(st.gen_len_B, jnp.zeros_like(len_K)),
      max_new_B=put(st.max_new_B, jnp.minimum(max_new_K, s_len - len_K)),
      active_B=put(st.active_B, jnp.ones_like(len_K, jnp.bool_)),
      keys_Bx2=put(st.keys_Bx2, keys_Kx2))


def result_step(graphdef, params, rest, st: DecodeState):
  """`step` packed as JetStream wants it: one int32 row per slot."""
  st, tok_B, _, valid_B = step(graphdef, params, rest, st)
  return st, jnp.stack([tok_B, valid_B.astype(jnp.int32), st.gen_len_B], axis=-1)


def init_state(graphdef, num_slots, max_len, vocab_size, params, rest, root_key_2,
                temperature, top_p, top_k, eos_E) -> DecodeState:
  cache = nnx.merge(graphdef, params, rest).init_cache(num_slots, max_len)
  return state_lib.empty_decode_state(
      cache=cache, vocab_size=vocab_size, root_key_2=root_key_2, temperature=temperature,
      top_p=top_p, top_k=top_k, eos_E=eos_E)
