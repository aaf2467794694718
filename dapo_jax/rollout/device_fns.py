"""The sampler's device functions, pure and jitted by `engine.Engine` (and by `dapo_jax.aot`,
which compiles them for a pod): prefill, insert, one decode step, a chunk of decode steps
(a while loop over `step`), JetStream's result step, and the empty decode state.

Shapes are fixed by the arguments; params and sampling parameters are traced, so new weights
or refilled slots never recompile.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax import sharding as sharding_lib
from dapo_jax.models import paged as paged_lib
from dapo_jax.models import qwen2
from dapo_jax.rollout import sampling, state as state_lib
from dapo_jax.rollout.state import DecodeState, Prefix

LAYER_LOOPS = ("auto", "unrolled", "scan")
PAGED_IMPLS = ("auto", "kernel", "tpu_kernel", "gpu_kernel", "reference")


EXPERT_DTYPE = jnp.int16  # recorded expert ids (routing replay): E < 32,768


def step(graphdef, params, rest, st: DecodeState, layer_params=None, table_BxP=None,
         paged: paged_lib.PagedSpec | None = None):
  """Samples one token in every slot, then runs the decode step for it (inactive slots idle)
  -> (state, tokens, log-probs, valid, the tokens' experts [B, Lm, K] or None for a dense
  model). The cache may be stacked or per layer; layer_params: see `Qwen2.decode_step`.
  paged: the cache is a page pool read through table_BxP (`models.paged.decode_step`)."""
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
  max_pos = (paged.max_len if paged else jax.tree.leaves(st.cache["k"])[0].shape[-3]) - 1
  model = nnx.merge(graphdef, params, rest)
  pos_B = jnp.minimum(st.positions_B, max_pos)
  if paged:
    logits_BxV, cache, ids = paged_lib.decode_step_routed(
        model, tok_B, pos_B, st.cache, table_BxP, paged, layer_params=layer_params)
  else:
    logits_BxV, cache, ids = model.decode_step_routed(tok_B, pos_B, st.cache,
                                                      layer_params=layer_params)
  new = st.replace(
      cache=cache, logits_BxV=logits_BxV.astype(jnp.float32),
      positions_B=st.positions_B + active_B.astype(jnp.int32), gen_len_B=gen_len_B,
      active_B=active_B)
  return new, tok_B, logp_B, valid_B, (None if ids is None else ids.transpose(1, 0, 2))


def generate_chunk(graphdef, params, rest, st: DecodeState, stop_on_finish, table_BxP=None, *,
                   max_steps: int, per_layer: bool, paged: paged_lib.PagedSpec | None = None,
                   record_experts: bool = False):
  """Runs up to max_steps steps; stops early once every slot is free, or (when stop_on_finish)
  as soon as any sample finishes, so the host can refill that slot at once. record_experts:
  the outputs also hold each token's experts, experts_BxCxLxK (int16; routing replay).
  per_layer (`per_layer_decode`): carry the cache per layer and per-layer weights sliced once
  before the loop (XLA:CPU would otherwise copy every stacked weight and a layer of cache at
  each step); else the stacked cache is scanned over in place (one buffer: accelerators).
  paged / table_BxP: a page pool and each row's pages (see `step`)."""
  b = st.active_B.shape[0]
  layer_params = None
  if per_layer:
    layer_params = nnx.merge(graphdef, params, rest).layer_params()
    ks, vs = (paged_lib.split_pages if paged else qwen2.split_cache)(st.cache)
    st = st.replace(cache={"k": tuple(ks), "v": tuple(vs)})

  def cond(carry):
    i, s, _, finished = carry
    return (i < max_steps) & jnp.any(s.active_B) & ~(stop_on_finish & finished)

  def body(carry):
    i, s, outs, _ = carry
    s, tok_B, logp_B, valid_B, ids = step(graphdef, params, rest, s, layer_params, table_BxP,
                                          paged)
    new = (tok_B, logp_B) + ((ids.astype(EXPERT_DTYPE),) if record_experts else ())
    outs = tuple(jax.lax.dynamic_update_index_in_dim(o, x, i, 1) for o, x in zip(outs, new))
    return i + 1, s, outs, jnp.any(valid_B & ~s.active_B)

  outs = (jnp.zeros((b, max_steps), jnp.int32), jnp.zeros((b, max_steps), jnp.float32))
  if record_experts:
    c = nnx.merge(graphdef, params, rest).cfg
    outs += (jnp.full((b, max_steps, len(c.moe_layers), c.num_experts_per_tok), -1,
                      EXPERT_DTYPE),)
  steps, st, outs, _ = jax.lax.while_loop(cond, body, (jnp.int32(0), st, outs, jnp.bool_(False)))
  if per_layer:
    stack = paged_lib.stack_pages if paged else qwen2.stack_cache
    st = st.replace(cache=stack(st.cache["k"], st.cache["v"]))
  extra = dict(experts_BxCxLxK=outs[2]) if record_experts else {}
  return st, dict(tokens_BxC=outs[0], logp_BxC=outs[1], steps=steps, gen_len_B=st.gen_len_B,
                  active_B=st.active_B, **extra)


def per_layer_decode(mesh, layer_loop: str = "auto") -> bool:
  """Whether the decode loop carries the cache per layer: layer_loop "unrolled" / "scan", or
  "auto" = unrolled on CPU meshes (see `generate_chunk`), scanned on accelerators."""
  if layer_loop not in LAYER_LOOPS:
    raise ValueError(f"layer_loop: must be one of {LAYER_LOOPS}, got {layer_loop!r}")
  if layer_loop == "auto":
    return mesh.devices.flat[0].platform == "cpu"
  return layer_loop == "unrolled"


def _kernel_misfit(kernel: str, head_dim: int, page_size: int, pages_per_block: int):
  """Why `kernel`'s block rules refuse these shapes, or None: the TPU kernel wants head_dim a
  multiple of 128 (its lane width); the GPU (Triton) kernel power-of-two tiles of >= 16 for
  its matmuls (head_dim, and the pages of one block: page_size x pages_per_block tokens)."""
  if kernel == "tpu" and head_dim % 128:
    return f"the TPU kernel needs head_dim a multiple of 128, got {head_dim}"
  pow2 = lambda n: n >= 16 and n & (n - 1) == 0
  if kernel == "gpu" and not (pow2(head_dim) and pow2(page_size * pages_per_block)):
    return (f"the GPU kernel needs head_dim and page_size x pages per block powers of two >= "
            f"16, got {head_dim} and {page_size} x {pages_per_block}")
  return None


def paged_kernel(impl: str, *, platform: str, head_dim: int, page_size: int,
                 pages_per_block: int) -> str:
  """Which decode attention a paged engine runs on a mesh of `platform` devices: "" (the
  reference gather) or a `paged.KERNELS` entry. impl "kernel" = the platform's kernel (the
  TPU one off GPU), "tpu_kernel" / "gpu_kernel" = that one (off its platform in interpret
  mode: the TPU kernel only under `pltpu.force_tpu_interpret_mode`), "auto" = the platform's
  kernel on TPU and GPU when its block rules hold (`_kernel_misfit`), else the reference."""
  if impl not in PAGED_IMPLS:
    raise ValueError(f"paged_impl: must be one of {PAGED_IMPLS}, got {impl!r}")
  native = platform if platform in paged_lib.KERNELS else ""
  want = {"reference": "", "auto": native, "kernel": "gpu" if platform == "gpu" else "tpu",
          "tpu_kernel": "tpu", "gpu_kernel": "gpu"}[impl]
  misfit = want and _kernel_misfit(want, head_dim, page_size, pages_per_block)
  if misfit and impl != "auto":
    raise ValueError(f"paged_impl: {misfit}")
  return "" if misfit else want


def paged_spec(mesh, *, max_len: int, slots: int, page_size: int, head_dim: int,
               impl: str = "auto") -> paged_lib.PagedSpec:
  """The page layout of a paged engine on `mesh`: pages per kernel block (8, or the most that
  divide a row's page count) and the decode attention (`paged_kernel`). Slots must split over
  the batch shards (each owns its rows' pages)."""
  if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
    raise ValueError(f"page_size: must be a positive int (tokens), got {page_size!r}")
  pps = -(-max_len // page_size)
  block = max(n for n in (8, 4, 2, 1) if pps % n == 0)
  kernel = paged_kernel(impl, platform=mesh.devices.flat[0].platform, head_dim=head_dim,
                        page_size=page_size, pages_per_block=block)
  shards = sharding_lib.batch_shards(mesh)
  if slots % shards:
    raise ValueError(f"num_slots: {slots} slots do not split over the {shards} batch shards "
                     "of the mesh (a paged cache keeps each shard's rows in its own pages)")
  return paged_lib.PagedSpec(page_size=page_size, max_len=max_len, kernel=kernel, mesh=mesh,
                             pages_per_block=block)


def pool_pages(mesh, spec: paged_lib.PagedSpec, *, slots: int, num_pages: int | None) -> int:
  """Pool size: num_pages, or by default every slot at max_len plus a null page per shard."""
  shards = sharding_lib.batch_shards(mesh)
  if num_pages is None:
    return slots * spec.pages_per_seq + shards
  if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages % shards or (
      num_pages // shards < spec.pages_per_seq + 1):
    raise ValueError(f"num_pages: {num_pages!r} must be an int multiple of the {shards} batch "
                     f"shards with at least {spec.pages_per_seq + 1} pages per shard (one "
                     f"sequence of {spec.max_len} tokens plus the null page)")
  return num_pages


def prefill(graphdef, params, rest, tokens_NxP, lengths_N, *,
            record_experts: bool = False) -> Prefix:
  """Prefix of N right-padded prompts; record_experts: with their tokens' experts."""
  model = nnx.merge(graphdef, params, rest)
  logits_NxV, cache, ids = model.prefill_routed(tokens_NxP, lengths_N)
  ids = ids.transpose(1, 2, 0, 3).astype(EXPERT_DTYPE) if record_experts else None
  return Prefix(cache=cache, logits_NpxV=logits_NxV.astype(jnp.float32), lengths_Np=lengths_N,
                expert_ids_NpxPxLxK=ids)


def insert(prefix: Prefix, st: DecodeState, src_K, slot_K, prompt_id_K, sample_id_K, max_new_K):
  """Copies prefix rows src_K into slots slot_K (an index equal to the slot count is a no-op)."""
  p = prefix.cache["k"].shape[2]
  cache = {name: st.cache[name].at[:, slot_K, :p].set(prefix.cache[name][:, src_K], mode="drop")
           for name in ("k", "v")}
  return _set_rows(prefix, st.replace(cache=cache), src_K, slot_K, prompt_id_K, sample_id_K,
                   max_new_K, st.cache["k"].shape[2])


def insert_paged(prefix: Prefix, st: DecodeState, src_K, slot_K, prompt_id_K, sample_id_K,
                 max_new_K, wsrc_W, wpage_W, wdst_W, *, page_size: int, max_len: int):
  """`insert` for a page pool: prompt page wpage_W[i] of prefix row wsrc_W[i] is copied into
  pool page wdst_W[i] (a page id equal to the pool size is a no-op); the rows' page tables are
  the host's (`rollout.pages`). A group's full prompt pages are written once and shared; each
  sample gets its own copy of the last partial page."""
  p = prefix.cache["k"].shape[2]
  pos_WxS = jnp.minimum(wpage_W[:, None] * page_size + jnp.arange(page_size)[None, :], p - 1)
  cache = {}
  for name in ("k", "v"):
    x = prefix.cache[name][:, wsrc_W[:, None], pos_WxS]  # [L, W, page, Kv, Hd]
    cache[name] = st.cache[name].at[:, :, wdst_W].set(
        x.transpose(3, 0, 1, 2, 4).astype(st.cache[name].dtype), mode="drop")
  return _set_rows(prefix, st.replace(cache=cache), src_K, slot_K, prompt_id_K, sample_id_K,
                   max_new_K, max_len)


def _set_rows(prefix, st, src_K, slot_K, prompt_id_K, sample_id_K, max_new_K, s_len):
  """The per-slot fields of an insert: logits, position, budget, RNG key, active."""
  len_K = prefix.lengths_Np[src_K]
  root = state_lib.wrap_key(st.root_key_2)
  keys_Kx2 = jax.vmap(lambda a, b: jax.random.key_data(
      jax.random.fold_in(jax.random.fold_in(root, a), b)))(prompt_id_K, sample_id_K)

  def put(x, v):
    return x.at[slot_K].set(v, mode="drop")

  return st.replace(
      logits_BxV=put(st.logits_BxV, prefix.logits_NpxV[src_K]),
      positions_B=put(st.positions_B, len_K),
      gen_len_B=put(st.gen_len_B, jnp.zeros_like(len_K)),
      max_new_B=put(st.max_new_B, jnp.minimum(max_new_K, s_len - len_K)),
      active_B=put(st.active_B, jnp.ones_like(len_K, jnp.bool_)),
      keys_Bx2=put(st.keys_Bx2, keys_Kx2))


def evict(st: DecodeState, slot_K) -> DecodeState:
  """Frees slots slot_K (padded with the slot count): a preempted sample stops drawing."""
  return st.replace(active_B=st.active_B.at[slot_K].set(False, mode="drop"))


def result_step(graphdef, params, rest, st: DecodeState):
  """`step` packed as JetStream wants it: one int32 row per slot."""
  st, tok_B, _, valid_B, _ = step(graphdef, params, rest, st)
  return st, jnp.stack([tok_B, valid_B.astype(jnp.int32), st.gen_len_B], axis=-1)


def init_state(graphdef, num_slots, max_len, vocab_size, params, rest, root_key_2,
               temperature, top_p, top_k, eos_E, *, num_pages: int = 0,
               page_size: int = 0) -> DecodeState:
  """All slots free; the cache dense [L, slots, max_len, Kv, Hd], or with num_pages a page
  pool [Kv, L, num_pages, page_size, Hd]."""
  model = nnx.merge(graphdef, params, rest)
  if num_pages:
    cache = paged_lib.init_pages(model.cfg, num_pages, page_size, model.dtype)
  else:
    cache = model.init_cache(num_slots, max_len)
  return state_lib.empty_decode_state(
      cache=cache, num_slots=num_slots, vocab_size=vocab_size, root_key_2=root_key_2,
      temperature=temperature,
      top_p=top_p, top_k=top_k, eos_E=eos_E)
