"""A JetStream Engine (google-jetstream 0.2.2 `engine_api.Engine`) over the Qwen2 policy.

Prefill computes a prompt's KV cache and its next-token logits; insert copies that prefix into a
decode slot; generate samples one token in every live slot and runs one decode step. The group
sampler (sampler.py) drives the very same jitted functions, batching inserts and running
several steps per call (`generate_chunk`, a while loop over one step), so there is one code
path. The functions themselves are pure and live in device_fns.py.

Shapes are fixed at construction (slots, prompt and total length), sampling parameters and
params are traced arguments, so neither new params nor refilled slots recompile.
"""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from jetstream.engine import engine_api
from jetstream.engine import tokenizer_pb2

from dapo_jax import sharding as sharding_lib
from dapo_jax.models import quant
from dapo_jax.rollout import device_fns, sampling, state as state_lib, tokenizer as tokenizer_lib
from dapo_jax.rollout import engine_weights
from dapo_jax.rollout.state import DecodeState, Prefix


class Engine(engine_api.Engine):
  """Decode slots over a Qwen2 policy (see the module docstring).

  model: a dapo_jax Qwen2 (nnx) with prefill / decode_step / init_cache; only its nnx.Param
    state is treated as params (weight sync replaces it), the rest is kept as built; with LoRA
    adapters (models/lora.py) only the adapters are (engine_weights.py).
  num_slots: concurrent samples (decode batch). max_prompt_len: prefill length (prompts are
    right-padded to it). max_len: cache length, prompt + response.
  mesh: mesh with axes among (data, fsdp, tensor); None = the first device.
  sampling_params: sampling parameters of the JetStream serving path (the sampler passes its
    own per call). steps_per_call: most steps of one `generate_chunk` call.
  bos_id / pad_id: what JetStream's orchestrator pads requests with (bos_id defaults to the HF
    tokenizer's; needed for serving only).
  tokenizer_path: HF tokenizer dir for JetStream text requests; None serves token-id requests.
  layer_loop: the decode loop's layer loop, one of device_fns.LAYER_LOOPS
    (`device_fns.per_layer_decode`: "auto" = per layer on CPU, scanned on accelerators).
  paged_kv: keep K/V in a page pool (`models/paged.py`; the group sampler allocates the pages,
    JetStream's orchestrator needs the dense cache) of num_pages pages of page_size tokens
    (None = every slot at max_len, plus one null page per batch shard). paged_impl: one of
    device_fns.PAGED_IMPLS ("auto" = the platform's Pallas kernel on TPU and GPU where its block
    rules hold, else the reference gather; `device_fns.paged_kernel`).
  record_experts: prefixes and decode chunks also return every token's experts per MoE layer
    (routing replay; a MoE model only).
  weight_dtype: the sampler's copy of the weights (models/quant.py): "auto" = the compute dtype,
    "bfloat16" / "float32", or "int8" (the layer projections per-channel int8, quantised here on
    the engine's devices at every load from the trainer's params; the rest in the compute dtype).
  """

  def __init__(self, model, *, num_slots: int, max_prompt_len: int, max_len: int, mesh=None,
               sampling_params: sampling.SamplingParams = sampling.SamplingParams(),
               steps_per_call: int = 16, tokenizer_path: str | None = None,
               bos_id: int | None = None, pad_id: int = 0, layer_loop: str = "auto",
               paged_kv: bool = False, page_size: int = 16, num_pages: int | None = None,
               paged_impl: str = "auto", record_experts: bool = False,
               weight_dtype: str = "auto"):
    self.cfg = model.cfg
    quant.check_model(self.cfg, weight_dtype)
    self.weight_dtype = weight_dtype
    if record_experts and not self.cfg.moe_layers:
      raise ValueError("record_experts: the model has no MoE layer whose routing to record")
    self.record_experts = bool(record_experts)
    (self._num_slots, self._max_prompt_len, self._max_len,
     self._steps_per_call) = state_lib.check_engine_sizes(self.cfg, num_slots, max_prompt_len,
                                                          max_len, steps_per_call)
    self.serving_sampling = sampling_params.validated(self.cfg.vocab_size)
    self._tokenizer_path, self._bos_id, self._pad_id = tokenizer_path, bos_id, pad_id
    self._requests_inserted = 0  # JetStream path: the sample id of each request's RNG stream

    if mesh is None:
      mesh = sharding_lib.make_mesh({"data": 1, "fsdp": 1, "tensor": 1},
                                    devices=jax.devices()[:1])
    self._mesh = mesh
    self._per_layer = device_fns.per_layer_decode(mesh, layer_loop)
    self._paged = device_fns.paged_spec(mesh, max_len=self._max_len, slots=self._num_slots,
                                        page_size=page_size, head_dim=self.cfg.head_dim,
                                        impl=paged_impl) if paged_kv else None
    self._num_pages = self._paged and device_fns.pool_pages(
        mesh, self._paged, slots=self._num_slots, num_pages=num_pages)
    self._weights = engine_weights.EngineWeights(model, mesh, weight_dtype)
    self._compile(self._weights.graphdef)

  def _compile(self, g):
    """The engine's jitted functions, with the cache and decode state laid out on its mesh."""
    c, mesh, pg = self.cfg, self._mesh, self._paged
    if pg:
      cache_shape = (c.num_kv_heads, c.num_layers, self._num_pages, pg.page_size, c.head_dim)
    else:
      cache_shape = (c.num_layers, self._num_slots, self._max_len, c.num_kv_heads, c.head_dim)
    self._state_shardings = state_lib.decode_state_shardings(
        mesh, cache_shape=cache_shape, vocab_size=c.vocab_size,
        num_slots=self._num_slots if pg else None)
    self._prefix_shardings = state_lib.prefix_shardings(
        mesh, cache_shape=(c.num_layers, 1, self._max_prompt_len, c.num_kv_heads, c.head_dim),
        record_experts=self.record_experts)
    self._jit_prefill = jax.jit(functools.partial(device_fns.prefill, g,
                                                  record_experts=self.record_experts),
                                out_shardings=self._prefix_shardings)
    insert = device_fns.insert if not pg else functools.partial(
        device_fns.insert_paged, page_size=pg.page_size, max_len=self._max_len)
    self._jit_insert = jax.jit(insert, donate_argnums=(1,), out_shardings=self._state_shardings)
    self._jit_evict = jax.jit(device_fns.evict, donate_argnums=(0,),
                              out_shardings=self._state_shardings)
    self._jit_chunk = jax.jit(
        functools.partial(device_fns.generate_chunk, g, max_steps=self._steps_per_call,
                          per_layer=self._per_layer, paged=pg,
                          record_experts=self.record_experts),
        donate_argnums=(2,), out_shardings=(self._state_shardings, None))
    self._jit_result_step = jax.jit(functools.partial(device_fns.result_step, g),
                                    donate_argnums=(2,),
                                    out_shardings=(self._state_shardings, None))
    self._jit_init = jax.jit(functools.partial(
        device_fns.init_state, g, self._num_slots, self._max_len, c.vocab_size,
        num_pages=self._num_pages or 0, page_size=pg.page_size if pg else 0),
                             out_shardings=self._state_shardings)

  @property
  def params(self):
    """The synced weights (the adapters alone for a LoRA policy: engine_weights.py)."""
    return self._weights.synced

  @property
  def _rest(self):
    return self._weights.rest

  def release_params(self) -> None:
    """Deletes the engine's synced weights (the colocated update's chips get their HBM back;
    the weight sync that follows the update refills them: `load_params`)."""
    self._weights.release()

  def load_params(self, params=None, *, free_old: bool = False):
    """Returns the engine's params; given `params` (the trainer's synced state: its nnx.Param
    state, or its adapters under LoRA, or a pure dict of the same tree, on any mesh, spanning
    any processes), checks them against the engine's and moves them device-to-device onto
    this engine's mesh in its dtype (`transfer_params`). Shapes and shardings never change, so
    nothing recompiles. free_old: delete the previous copy first, so the transfer's peak holds
    one sampler copy (only when nothing else holds it: the sampler's weight sync)."""
    if params is None:
      return self.params
    return self._weights.load(params, free_old=free_old)

  def sync_bytes(self) -> int:
    """Bytes one weight sync moves onto this engine."""
    return self._weights.sync_bytes()

  def prefill(self, *, params, existing_prefix=None, padded_tokens, true_length: int) -> Prefix:
    """Prefix (Np = 1) of one right-padded prompt; the first response token is drawn from it."""
    if existing_prefix is not None:
      raise NotImplementedError("existing_prefix: continuing from a cached prefix (multi-turn "
                                "session cache) is not supported by this engine")
    tokens = np.asarray(padded_tokens).reshape(-1)
    n = int(true_length)
    if not 1 <= n <= min(tokens.shape[0], self._max_prompt_len):
      raise ValueError(f"true_length: {n} must be in [1, min(len(padded_tokens)="
                       f"{tokens.shape[0]}, max_prefill_length={self._max_prompt_len})]")
    row = np.zeros((1, self._max_prompt_len), np.int32)
    row[0, :n] = tokens[:n]
    return self.prefill_batch(params, row, np.asarray([n], np.int32))

  def prefill_batch(self, params, tokens_NxP, lengths_N) -> Prefix:
    """Prefills N prompts at once (tokens right-padded to max_prefill_length)."""
    return self._jit_prefill(params, self._rest, tokens_NxP, lengths_N)

  def insert(self, prefix: Prefix, decode_state: DecodeState, slot: int) -> DecodeState:
    """Puts a JetStream request into `slot`; it generates until EOS or the cache is full (the
    orchestrator applies max_tokens). Its RNG stream is (engine seed, request number)."""
    self._dense_only("insert")
    if not 0 <= slot < self._num_slots:
      raise ValueError(f"slot: {slot} not in [0, {self._num_slots})")
    st = self.insert_many(prefix, decode_state, src=[0], slots=[slot],
                          prompt_ids=[self._requests_inserted], sample_ids=[0],
                          max_new=[self._max_len])
    self._requests_inserted += 1
    return st

  def insert_many(self, prefix: Prefix, decode_state: DecodeState, *, src, slots, prompt_ids,
                  sample_ids, max_new, page_writes=None) -> DecodeState:
    """Copies prefix rows src[i] into slots[i], sample (prompt_ids[i], sample_ids[i]), with a
    budget of max_new[i] tokens; padded to the slot count so one compiled insert serves all.
    page_writes (paged only): (prefix row, prompt page, pool page) triples to copy
    (`rollout.pages.PagePool.admit`), padded to a fixed count likewise."""
    k = len(slots)
    if not 1 <= k <= self._num_slots or any(len(x) != k for x in (src, prompt_ids, sample_ids,
                                                                  max_new)):
      raise ValueError(f"insert_many: src, slots, prompt_ids, sample_ids, max_new need one equal "
                       f"length in [1, {self._num_slots}], got slots of length {k}")
    pad = self._num_slots - k

    def arr(x, fill):
      return np.concatenate([np.asarray(x, np.int32), np.full((pad,), fill, np.int32)])

    args = (arr(src, 0), arr(slots, self._num_slots), arr(prompt_ids, 0), arr(sample_ids, 0),
            arr(max_new, 0))
    if self._paged:
      args += _pad_writes(page_writes, self.max_page_writes(prefix), self._num_pages)
    return self._jit_insert(prefix, decode_state, *args)

  def max_page_writes(self, prefix: Prefix) -> int:
    """Page copies one insert can make: each prompt of the prefix batch's full pages once per
    batch shard, and one partial page per slot."""
    n, p = prefix.lengths_Np.shape[0], self._max_prompt_len
    return n * (p // self._paged.page_size) * self.batch_shards + self._num_slots

  def evict(self, decode_state: DecodeState, slots) -> DecodeState:
    """Stops the samples in `slots` (a preempted sample is re-run from its start later)."""
    return self._jit_evict(decode_state, _pad(slots, self._num_slots, self._num_slots))

  def generate(self, params, decode_state: DecodeState):
    """One token in every slot -> (state, ResultTokens [B, token | valid | length])."""
    self._dense_only("generate")
    st, data_Bx3 = self._jit_result_step(params, self._rest, decode_state)
    return st, engine_api.ResultTokens(data=data_Bx3, tokens_idx=(0, 1), valid_idx=(1, 2),
                                       length_idx=(2, 3), samples_per_slot=1)

  def generate_chunk(self, params, decode_state: DecodeState, *, stop_on_finish: bool,
                     page_table=None):
    """Up to steps_per_call steps in one call (`device_fns.generate_chunk`) -> (state, outs).
    page_table (paged only): int32 [slots, pages_per_seq], each row's pool pages."""
    if (page_table is None) != (self._paged is None):
      raise ValueError("page_table: needed exactly when the engine is paged (paged_kv=True)")
    args = () if page_table is None else (np.asarray(page_table, np.int32),)
    return self._jit_chunk(params, self._rest, decode_state, jnp.bool_(stop_on_finish), *args)

  def _dense_only(self, what: str):
    if self._paged:
      raise ValueError(f"{what}: JetStream's slot API needs the dense cache; build the Engine "
                       "with paged_kv=False to serve (the group sampler drives paged engines)")

  def init_decode_state(self, sampling_params: sampling.SamplingParams | None = None):
    """All slots free, with the given (validated) sampling parameters or the serving ones."""
    sp = self.serving_sampling if sampling_params is None else sampling_params
    sp = sp.validated(self.cfg.vocab_size)
    return self._jit_init(self.params, self._rest, state_lib.root_key_data(sp.seed),
                          np.float32(sp.temperature), np.float32(sp.top_p), np.int32(sp.top_k),
                          sp.eos_array())

  def get_prefix_destination_sharding(self) -> Prefix:
    return self._prefix_shardings

  def get_tokenizer(self) -> tokenizer_pb2.TokenizerParameters:
    return tokenizer_pb2.TokenizerParameters(path=self._tokenizer_path or "", extra_ids=0)

  def build_tokenizer(self, metadata: tokenizer_pb2.TokenizerParameters):
    eos = self.serving_sampling.eos_ids
    return tokenizer_lib.build(metadata.path, eos_ids=eos, bos_id=self._bos_id,
                               pad_id=self._pad_id)

  @property
  def max_concurrent_decodes(self) -> int:
    return self._num_slots

  @property
  def samples_per_slot(self) -> int:
    return 1

  @property
  def max_prefill_length(self) -> int:
    return self._max_prompt_len

  @property
  def max_len(self) -> int:
    return self._max_len

  @property
  def paged(self):
    """The `models.paged.PagedSpec`, or None for the dense cache."""
    return self._paged

  @property
  def num_pages(self) -> int:
    return self._num_pages or 0

  @property
  def batch_shards(self) -> int:
    return sharding_lib.batch_shards(self._mesh)

  @property
  def steps_per_call(self) -> int:
    return self._steps_per_call

  @property
  def mesh(self) -> jax.sharding.Mesh:
    return self._mesh

  @property
  def colocated_cpus(self) -> None:
    # Host-side work here is plain numpy on the controller; no colocated CPU devices are used.
    return None


def _pad(x, n: int, fill: int) -> np.ndarray:
  x = np.asarray(x, np.int32)
  return np.concatenate([x, np.full((n - x.size,), fill, np.int32)])


def _pad_writes(writes, n: int, num_pages: int) -> tuple:
  """(prefix rows, prompt pages, pool pages) int32 [n]; padding writes to page num_pages
  (out of range: dropped)."""
  w = np.asarray(list(writes or ()), np.int32).reshape(-1, 3)
  if w.shape[0] > n:
    raise ValueError(f"page_writes: {w.shape[0]} page copies exceed the insert's {n}")
  return _pad(w[:, 0], n, 0), _pad(w[:, 1], n, 0), _pad(w[:, 2], n, num_pages)

