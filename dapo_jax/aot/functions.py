"""The jitted functions of one rollout step, with abstract arguments on a TPU slice's meshes.

Each `Job` is what the trainer or the sampler jits (the same function, shardings and static
arguments), the abstract arguments to lower it with, how many times it runs per rollout step,
and which long-lived buffers stay in HBM beside it (they add to its peak: the step's peak is
the largest of these sums).
"""
import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax import sharding
from dapo_jax.aot import shapes, topology
from dapo_jax.models import lora, quant
from dapo_jax.config import Config
from dapo_jax.rollout import budget, device_fns, sampling, state as rstate, transfer
from dapo_jax.train import logprob_pass, placement, setup
from dapo_jax.train import batch as batch_lib
from dapo_jax.train import train_step as train_step_lib


@dataclasses.dataclass
class Job:
  name: str
  fn: object                 # a jax.jit-wrapped function
  args: tuple                # abstract arguments (ShapeDtypeStructs with shardings)
  resident: tuple            # names of the Plan.buffers alive in HBM beside this call

  @property
  def side(self) -> str:
    """The role whose chips run it (they differ under rollout.placement='split')."""
    return "sampler" if self.name.startswith("sampler_") else "trainer"


# Which role's chips hold each long-lived buffer.
BUFFER_SIDE = {"train_state": "trainer", "opt_state": "trainer", "ref_params": "trainer",
               "frozen_params": "trainer", "sampler_params": "sampler",
               "sampler_base": "sampler", "decode_state": "sampler", "prefix": "sampler"}
# LoRA (config.lora.rank > 0): train_state holds the adapters and their optimizer state,
# frozen_params the trainer's frozen base; sampler_params the sampler's adapters (what a sync
# replaces, and what the colocated update frees), sampler_base its own copy of the base.


@dataclasses.dataclass
class Plan:
  """Everything the report needs: jobs, long-lived buffers (bytes per chip), sizes."""
  jobs: list
  buffers: dict              # name -> bytes per chip
  info: dict                 # meshes, slots, rows: shown in the report and the JSON


def _rows(cfg: Config) -> int:
  """Rows of one log-prob call: a micro-batch."""
  return cfg.minibatch_seqs // cfg.micro_batches


def trainer_jobs(cfg: Config, mcfg, mesh) -> tuple[list, dict, object]:
  """train_step (one mini-batch update) and the log-prob pass, as the trainer jits them: the
  same jit (train_step.jit_train_step) on the same abstract MiniBatch prepare builds."""
  model = shapes.abstract_model(mcfg, mesh, lora_cfg=cfg.lora)
  optimizer, init, state = shapes.train_state(cfg, model, mesh)
  frozen = () if model.frozen is None else (model.frozen,)  # LoRA: the base, read-only
  dsh = sharding.data_sharding(mesh)
  rows, t = _rows(cfg), cfg.seq_len

  def arr(n, dtype, *shape):
    return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=dsh)

  moe_shape = (len(mcfg.moe_layers), mcfg.num_experts_per_tok)
  minibatch = batch_lib.abstract_minibatch(cfg, dsh, moe_shape)
  replay = (arr(rows, jnp.int16, t, *moe_shape),) if cfg.model.routing_replay else ()
  step = train_step_lib.jit_train_step(cfg, graphdef=model.graphdef, optimizer=optimizer,
                                       mesh=mesh,
                                       state_shardings=jax.tree.map(lambda x: x.sharding, state),
                                       frozen_shardings=model.frozen_shardings)
  logp = jax.jit(functools.partial(logprob_pass.logprob_fn, graphdef=model.graphdef, mesh=mesh,
                                   temperature=cfg.rollout.temperature, with_entropy=True))
  # The sampler's weights sit beside the update unless the loop frees them for it.
  # (Under LoRA only its adapters are freed: its copy of the base stays.)
  sampler = ("sampler_base",) + (() if placement.frees_sampler_weights(cfg)
                                 else ("sampler_params",))
  policy = lora.join(model.params, model.frozen)
  jobs = [Job("init_train_state", init, (model.params,), ("frozen_params",)),
          Job("train_step", step, (state, minibatch, *frozen), (*sampler, "ref_params")),
          Job("old_logprobs", logp,
              (policy, *(arr(rows, jnp.int32, t) for _ in range(3)), *replay),
              ("opt_state", *sampler, "ref_params"))]
  buffers = {"train_state": shapes.bytes_per_chip(state),
             "opt_state": shapes.bytes_per_chip(state.opt_state),
             "ref_params": shapes.bytes_per_chip(model.params) if cfg.algo.kl_coef > 0 else 0,
             "frozen_params": shapes.bytes_per_chip(frozen)}
  return jobs, buffers, model


def _sampler_cache(cfg: Config, mcfg, smesh, slots: int) -> dict:
  """The decode state's cache layout: dense, or the paged pool (pages from the budget)."""
  c, rollout, max_len = mcfg, cfg.rollout, cfg.seq_len
  if not rollout.paged_kv:
    return dict(shape=(c.num_layers, slots, max_len, c.num_kv_heads, c.head_dim), spec=None,
                num_pages=0)
  spec = device_fns.paged_spec(smesh, max_len=max_len, slots=slots, page_size=rollout.page_size,
                               head_dim=c.head_dim)
  n = device_fns.pool_pages(smesh, spec, slots=slots, num_pages=budget.sampler_pages(
      kv_cache_gib=rollout.kv_cache_gib, mcfg=mcfg, max_len=max_len, page_size=rollout.page_size,
      mesh_shape=smesh.shape))
  return dict(shape=(c.num_kv_heads, c.num_layers, n, rollout.page_size, c.head_dim), spec=spec,
              num_pages=n)


def _insert_and_table(cfg: Config, pg, smesh, slots: int, np_batch: int, host):
  """The insert function, its page-write arguments (the engine's max_page_writes) and the
  page-table argument of generate_chunk: none of these extras for the dense cache."""
  if pg is None:
    return device_fns.insert, [], ()
  shards = sharding.batch_shards(smesh)
  w = np_batch * (cfg.task.max_prompt_len // pg.page_size) * shards + slots
  insert = functools.partial(device_fns.insert_paged, page_size=pg.page_size,
                             max_len=cfg.seq_len)
  return insert, [host((w,), jnp.int32)] * 3, (host((slots, pg.pages_per_seq), jnp.int32),)


def _decode_state(cfg: Config, sm, smesh, slots: int, cache: dict, host):
  """The abstract decode state (as init_decode_state builds it) and its shardings."""
  c, pg = sm.cfg, cache["spec"]
  state_sh = rstate.decode_state_shardings(smesh, cache_shape=cache["shape"],
                                           vocab_size=c.vocab_size,
                                           num_slots=slots if pg else None)
  key = host((2,), jnp.uint32)
  scal = [host((), jnp.float32), host((), jnp.float32), host((), jnp.int32)]
  eos = host((sampling.MAX_EOS_IDS,), jnp.int32)
  init = functools.partial(device_fns.init_state, sm.graphdef, slots, cfg.seq_len, c.vocab_size,
                           num_pages=cache["num_pages"],
                           page_size=cfg.rollout.page_size if pg else 0)
  return (shapes.sds(jax.eval_shape(init, sm.params, sm.rest, key, *scal, eos), state_sh),
          state_sh)


def _sampler_slots(cfg: Config, mcfg, smesh, hosts: int) -> int:
  """Concurrent sequences per sampler replica, as make_sampler sizes them."""
  r = cfg.rollout
  return budget.sampler_slots(
      num_slots=r.num_slots, kv_cache_gib=r.kv_cache_gib, group_size=r.group_size, mcfg=mcfg,
      max_len=cfg.seq_len, mesh_shape=smesh.shape, paged=r.paged_kv, hosts=hosts)


def weight_dtype(cfg: Config, mcfg) -> str:
  """The sampler's weight dtype by name (rollout.weight_dtype, "auto" = the compute dtype)."""
  w = cfg.rollout.weight_dtype
  return jnp.dtype(mcfg.dtype).name if w == "auto" else w


def sampler_model(cfg: Config, mcfg, smesh) -> shapes.Model:
  """The sampler's abstract model as the Engine holds it: params in rollout.weight_dtype
  (int8: the projections as quant.Int8Weight, models/quant.py); under LoRA the adapters in the
  compute dtype and the frozen base so (rollout/engine_weights.py)."""
  w = weight_dtype(cfg, mcfg)
  sm = shapes.abstract_model(mcfg, smesh, dtype=quant.storage_dtype(w, mcfg.dtype),
                             lora_cfg=cfg.lora, adapter_dtype=mcfg.dtype)
  if w != "int8":
    return sm
  if sm.frozen is not None:
    return dataclasses.replace(sm, frozen=quant.abstract_quantized(sm.frozen,
                                                                   sm.frozen_shardings))
  return dataclasses.replace(sm, params=quant.abstract_quantized(sm.params, sm.shardings))


def sampler_jobs(cfg: Config, mcfg, smesh, hosts: int = 1) -> tuple[list, dict, int, dict]:
  """prefill / insert / generate chunk on one sampler replica's mesh, as engine.py jits them."""
  rollout = cfg.rollout
  slots = _sampler_slots(cfg, mcfg, smesh, hosts)
  sm = sampler_model(cfg, mcfg, smesh)
  g, c, record = sm.graphdef, mcfg, cfg.model.routing_replay  # record: the experts
  cache = _sampler_cache(cfg, mcfg, smesh, slots)
  pg, np_batch = cache["spec"], math.ceil(slots / rollout.group_size)  # make_sampler's default
  prefix_sh = rstate.prefix_shardings(
      smesh, cache_shape=(c.num_layers, 1, cfg.task.max_prompt_len, c.num_kv_heads, c.head_dim),
      record_experts=record)
  rep = NamedSharding(smesh, P())

  def host(shape, dtype):  # host numpy arguments land replicated
    return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)

  st, state_sh = _decode_state(cfg, sm, smesh, slots, cache, host)
  prefill = jax.jit(functools.partial(device_fns.prefill, g, record_experts=record),
                    out_shardings=prefix_sh)
  toks = (host((np_batch, cfg.task.max_prompt_len), jnp.int32), host((np_batch,), jnp.int32))
  prefix = shapes.sds(jax.eval_shape(prefill, sm.params, sm.rest, *toks), prefix_sh)
  insert_fn, write_args, chunk_args = _insert_and_table(cfg, pg, smesh, slots, np_batch, host)
  ids = [host((slots,), jnp.int32)] * 5 + write_args
  insert = jax.jit(insert_fn, donate_argnums=(1,), out_shardings=state_sh)
  chunk = jax.jit(functools.partial(device_fns.generate_chunk, g, max_steps=rollout.steps_per_call,
                                    per_layer=device_fns.per_layer_decode(smesh), paged=pg,
                                    record_experts=record),
                  donate_argnums=(2,), out_shardings=(state_sh, None))
  trainer = ("train_state", "frozen_params")
  jobs = [Job("sampler_prefill", prefill, (sm.params, sm.rest, *toks), (*trainer, "decode_state")),
          Job("sampler_insert", insert, (prefix, st, *ids),
              (*trainer, "sampler_params", "sampler_base")),
          Job("sampler_generate_chunk", chunk,
              (sm.params, sm.rest, st, host((), jnp.bool_), *chunk_args), (*trainer, "prefix"))]
  buffers = {"sampler_params": shapes.bytes_per_chip(sm.params),
             "sampler_base": shapes.bytes_per_chip(sm.rest),  # LoRA: the held base
             "decode_state": shapes.bytes_per_chip(st), "prefix": shapes.bytes_per_chip(prefix)}
  info = dict(paged_kv=bool(pg), page_size=rollout.page_size,
              pool_pages_per_host=cache["num_pages"], sampler_weight_dtype=weight_dtype(cfg, mcfg),
              sampler_weight_bytes_per_chip=buffers["sampler_params"] + buffers["sampler_base"])
  return jobs, buffers, slots, info


def transfer_job(mcfg, model, gmesh, trainer_mesh=None, wdtype: str = "auto",
                 lora_cfg=None) -> Job:
  """Trainer params -> the sampler's dtype and layout on the global sampler mesh (the
  device-to-device all-gather of engine.load_params; each host then keeps its own shards).
  Split placement (`trainer_mesh` given): the all-gather into the sampler's tensor layout on
  the trainer's chips, from which each host's sampler chips copy their shards. LoRA
  (`lora_cfg.rank` > 0): `model.params` are the adapters, and they alone move."""
  target = shapes.abstract_model(mcfg, gmesh, dtype=mcfg.dtype, lora_cfg=lora_cfg).shardings
  if lora_cfg is not None and lora_cfg.rank:  # the adapters alone, compute dtype, never int8
    wdtype = "auto"
  if trainer_mesh is not None:
    target = jax.tree.map(lambda s: NamedSharding(trainer_mesh, transfer.tensor_only(s.spec)),
                          target)
  dtype = quant.storage_dtype(wdtype, mcfg.dtype)
  cast = lambda p: jax.tree.map(lambda x: x.astype(dtype), p)  # noqa: E731
  if wdtype == "int8":  # quantised on the sampler's chips, in the same pass
    target, cast = quant.quantized_shardings(target), lambda p, c=cast: quant.quantize_tree(c(p))
  fn = jax.jit(cast, out_shardings=target)
  return Job("weight_transfer", fn, (model.params,),  # the old copy is freed
             ("opt_state", "frozen_params", "sampler_base"))


def host_devices(devices, hosts: int, host_slice=None) -> list:
  """The chips of the first host: each host drives the sampler replicas on its own chips.

  XLA's TPU compiler, compiling for a subset of a compile-only slice, refuses a collective
  whose device ids are not 0..n-1 ("Unexpected device_id 4 in replica group (0,1,2,3) :: target
  has 4 device_id"; libtpu 0.0.42, v6e: a host's 2x2 chips are ids 0, 1, 4, 5 of a 4x4 grid).
  Then the host's chips are taken from `host_slice` (topology.one_host: a topology of one host,
  the same chips and grid, ids 0..n-1): the same per-chip memory, collectives on the same 2x2."""
  first = [d for d in devices if d.process_index == devices[0].process_index]
  per_host = len(devices) // hosts
  chips = first if len(first) == per_host else list(devices[:per_host])
  if host_slice is None or sorted(d.id for d in chips) == list(range(len(chips))):
    return chips
  return topology.devices(host_slice)[-len(chips):]


def build_plan(cfg: Config, devices, *, hosts: int, host_slice=None) -> Plan:
  """All jobs of a rollout step for `devices` (one TPU slice of `hosts` hosts; `host_slice`:
  one host's topology, see `host_devices`)."""
  mcfg, source = shapes.model_config(cfg)
  placed = placement.place(cfg, devices)
  mesh = placement.build_mesh(cfg, list(placed.trainer))
  setup.check_batch_fits_mesh(cfg, mesh, hosts)
  gmesh = placement.build_sampler_mesh(cfg, list(placed.sampler))
  smesh = placement.build_sampler_mesh(cfg, host_devices(list(placed.sampler), hosts,
                                                       host_slice))
  tjobs, tbuf, model = trainer_jobs(cfg, mcfg, mesh)  # LoRA: model.params are the adapters
  sjobs, sbuf, slots, sinfo = sampler_jobs(cfg, mcfg, smesh, hosts)
  jobs = tjobs + sjobs + [transfer_job(mcfg, model, gmesh, mesh if placed.split else None,
                                       cfg.rollout.weight_dtype, cfg.lora)]
  if placed.split:  # each role's chips hold only its own buffers
    for job in jobs:
      job.resident = tuple(b for b in job.resident if BUFFER_SIDE[b] == job.side)
  info = dict(model_source=source, num_params=mcfg.num_params, placement=cfg.rollout.placement,
              trainer_chips=len(placed.trainer), sampler_chips=len(placed.sampler),
              trainer_mesh=dict(mesh.shape),
              sampler_mesh_per_host=dict(smesh.shape), sampler_mesh_global=dict(gmesh.shape),
              sampler_slots_per_host=slots, sampler_slots_global=slots * hosts,
              logprob_rows=_rows(cfg), minibatch_rows=cfg.minibatch_seqs,
              seq_len=cfg.seq_len, steps_per_call=cfg.rollout.steps_per_call, **sinfo)
  return Plan(jobs=jobs, buffers={**tbuf, **sbuf}, info=info)
