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
from dapo_jax.aot import shapes
from dapo_jax.config import Config
from dapo_jax.rollout import budget, device_fns, sampling, state as rstate
from dapo_jax.train import setup
from dapo_jax.train import logprob_pass, packing
from dapo_jax.train.train_step import train_step


@dataclasses.dataclass
class Job:
  name: str
  fn: object                 # a jax.jit-wrapped function
  args: tuple                # abstract arguments (ShapeDtypeStructs with shardings)
  resident: tuple            # names of the Plan.buffers alive in HBM beside this call


@dataclasses.dataclass
class Plan:
  """Everything the report needs: jobs, long-lived buffers (bytes per chip), sizes."""
  jobs: list
  buffers: dict              # name -> bytes per chip
  info: dict                 # meshes, slots, rows: shown in the report and the JSON


def _rows(cfg: Config) -> int:
  return cfg.train.micro_batch_size or cfg.minibatch_prompts * cfg.rollout.group_size


def check_splits(cfg: Config, mesh, hosts: int):
  """The batch checks of setup.check_batch_fits_mesh, for the slice's mesh and host count."""
  shards = mesh.shape["data"] * mesh.shape["fsdp"]
  seqs = cfg.minibatch_prompts * cfg.rollout.group_size
  for what, n in (("train.micro_batch_size", _rows(cfg)), ("train.batch_size", seqs)):
    if n % shards:
      raise ValueError(f"config.{what}: {n} sequences per (micro-)batch do not split over "
                       f"{shards} data-parallel shards (mesh data x fsdp = {dict(mesh.shape)})")
  a = cfg.algo
  round_prompts = a.gen_batch_size if a.dynamic_sampling else cfg.train.batch_size
  if round_prompts % hosts:
    raise ValueError(f"config.algo.gen_batch_size: {round_prompts} prompts per round do not "
                     f"split over the slice's {hosts} hosts")


def trainer_jobs(cfg: Config, mcfg, mesh) -> tuple[list, dict, object]:
  """train_step (one mini-batch update) and the log-prob pass, as trainer.py jits them."""
  model = shapes.abstract_model(mcfg, mesh)
  optimizer, init, state = shapes.train_state(cfg, model, mesh)
  dsh = sharding.data_sharding(mesh)
  rep = NamedSharding(mesh, P())
  seqs, rows, t = cfg.minibatch_prompts * cfg.rollout.group_size, _rows(cfg), cfg.seq_len

  def arr(n, dtype, *shape):
    return jax.ShapeDtypeStruct((n, *shape), dtype, sharding=dsh)

  minibatch = {"tokens": arr(seqs, jnp.int32, t), "attn_mask": arr(seqs, jnp.float32, t),
               "loss_mask": arr(seqs, jnp.float32, t), "old_logp": arr(seqs, jnp.float32, t),
               "adv": arr(seqs, jnp.float32), "pack_micro": arr(seqs, jnp.int32),
               **{k: arr(seqs, jnp.int32, t) for k in packing.KEYS[:4]}}
  if cfg.algo.kl_coef > 0:
    minibatch["ref_logp"] = arr(seqs, jnp.float32, t)
  if cfg.algo.is_correction != "none":
    minibatch["behav_logp"] = arr(seqs, jnp.float32, t)
  state_sh = jax.tree.map(lambda x: x.sharding, state)
  step = jax.jit(functools.partial(train_step, graphdef=model.graphdef, optimizer=optimizer,
                                   cfg=cfg, mesh=mesh),
                 in_shardings=(state_sh, dsh), out_shardings=(state_sh, rep),
                 donate_argnums=(0,))
  logp = jax.jit(functools.partial(logprob_pass.logprob_fn, graphdef=model.graphdef, mesh=mesh,
                                   temperature=cfg.rollout.temperature, with_entropy=True))
  jobs = [Job("init_train_state", init, (model.params,), ()),
          Job("train_step", step, (state, minibatch), ("sampler_params", "ref_params")),
          Job("old_logprobs", logp, (model.params, *(arr(rows, jnp.int32, t) for _ in range(3))),
              ("opt_state", "sampler_params", "ref_params"))]
  buffers = {"train_state": shapes.bytes_per_chip(state),
             "opt_state": shapes.bytes_per_chip(state.opt_state),
             "ref_params": shapes.bytes_per_chip(model.params) if cfg.algo.kl_coef > 0 else 0}
  return jobs, buffers, model


def sampler_jobs(cfg: Config, mcfg, smesh, steps_per_call: int) -> tuple[list, dict, int]:
  """prefill / insert / generate chunk on one sampler replica's mesh, as engine.py jits them."""
  max_len = cfg.seq_len
  slots = budget.sampler_slots(
      num_slots=cfg.rollout.num_slots, kv_cache_gib=cfg.rollout.kv_cache_gib,
      group_size=cfg.rollout.group_size, mcfg=mcfg, max_len=max_len, mesh_shape=smesh.shape)
  sm = shapes.abstract_model(mcfg, smesh, dtype=mcfg.dtype)
  g, c = sm.graphdef, mcfg
  rest = {}
  np_batch = math.ceil(slots / cfg.rollout.group_size)  # make_sampler's default prefill batch
  state_sh = rstate.decode_state_shardings(
      smesh, cache_shape=(c.num_layers, slots, max_len, c.num_kv_heads, c.head_dim),
      vocab_size=c.vocab_size)
  prefix_sh = rstate.prefix_shardings(
      smesh, cache_shape=(c.num_layers, 1, cfg.task.max_prompt_len, c.num_kv_heads, c.head_dim))
  rep = NamedSharding(smesh, P())

  def host(shape, dtype):  # host numpy arguments land replicated
    return jax.ShapeDtypeStruct(shape, dtype, sharding=rep)

  key = host((2,), jnp.uint32)
  scal = [host((), jnp.float32), host((), jnp.float32), host((), jnp.int32)]
  eos = host((sampling.MAX_EOS_IDS,), jnp.int32)
  init = functools.partial(device_fns.init_state, g, slots, max_len, c.vocab_size)
  st = shapes.sds(jax.eval_shape(init, sm.params, rest, key, *scal, eos), state_sh)
  prefill = jax.jit(functools.partial(device_fns.prefill, g), out_shardings=prefix_sh)
  toks = (host((np_batch, cfg.task.max_prompt_len), jnp.int32), host((np_batch,), jnp.int32))
  prefix = shapes.sds(jax.eval_shape(prefill, sm.params, rest, *toks), prefix_sh)
  insert = jax.jit(device_fns.insert, donate_argnums=(1,), out_shardings=state_sh)
  chunk = jax.jit(functools.partial(device_fns.generate_chunk, g, max_steps=steps_per_call,
                                    per_layer=device_fns.per_layer_decode(smesh)),
                  donate_argnums=(2,), out_shardings=(state_sh, None))
  ids = [host((slots,), jnp.int32)] * 5
  jobs = [Job("sampler_prefill", prefill, (sm.params, rest, *toks),
              ("train_state", "decode_state")),
          Job("sampler_insert", insert, (prefix, st, *ids), ("train_state", "sampler_params")),
          Job("sampler_generate_chunk", chunk, (sm.params, rest, st, host((), jnp.bool_)),
              ("train_state", "prefix"))]
  buffers = {"sampler_params": shapes.bytes_per_chip(sm.params),
             "decode_state": shapes.bytes_per_chip(st), "prefix": shapes.bytes_per_chip(prefix)}
  return jobs, buffers, slots


def transfer_job(mcfg, model, gmesh) -> Job:
  """Trainer params -> the sampler's dtype and layout on the global sampler mesh (the
  device-to-device all-gather of engine.load_params; each host then keeps its own shards)."""
  target = shapes.abstract_model(mcfg, gmesh, dtype=mcfg.dtype)
  dtype = jnp.dtype(mcfg.dtype)
  fn = jax.jit(lambda p: jax.tree.map(lambda x: x.astype(dtype), p),
               out_shardings=target.shardings)
  return Job("weight_transfer", fn, (model.params,), ("opt_state",))  # the old copy is freed


def host_devices(devices, hosts: int) -> list:
  """The chips of the first host: each host drives the sampler replicas on its own chips."""
  first = [d for d in devices if d.process_index == devices[0].process_index]
  per_host = len(devices) // hosts
  return first if len(first) == per_host else list(devices[:per_host])


def build_plan(cfg: Config, devices, *, hosts: int, steps_per_call: int = 16) -> Plan:
  """All jobs of a rollout step for `devices` (one TPU slice of `hosts` hosts)."""
  mcfg, source = shapes.model_config(cfg)
  mesh = setup.build_mesh(cfg, devices)
  check_splits(cfg, mesh, hosts)
  gmesh = setup.build_sampler_mesh(cfg, devices)
  smesh = setup.build_sampler_mesh(cfg, host_devices(devices, hosts))
  tjobs, tbuf, model = trainer_jobs(cfg, mcfg, mesh)
  sjobs, sbuf, slots = sampler_jobs(cfg, mcfg, smesh, steps_per_call)
  jobs = tjobs + sjobs + [transfer_job(mcfg, model, gmesh)]
  info = dict(model_source=source, num_params=mcfg.num_params, trainer_mesh=dict(mesh.shape),
              sampler_mesh_per_host=dict(smesh.shape), sampler_mesh_global=dict(gmesh.shape),
              sampler_slots_per_host=slots, sampler_slots_global=slots * hosts,
              logprob_rows=_rows(cfg), minibatch_rows=cfg.minibatch_prompts * cfg.rollout.group_size,
              seq_len=cfg.seq_len, steps_per_call=steps_per_call)
  return Plan(jobs=jobs, buffers={**tbuf, **sbuf}, info=info)
