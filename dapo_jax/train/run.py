"""A run's parts (`Run`), built once from a validated Config (`build`): the built parts, the
policy's (`ModelParts`), and what the loop changes (`LoopState`)."""
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.data.pipeline import PromptIterator
from dapo_jax.models.config import ModelConfig
from dapo_jax.rollout import budget
from dapo_jax.rollout.sampler import GroupSampler, PagingTally
from dapo_jax.models import lora
from dapo_jax.train import adapters, checkpoint_dirs, placement, setup, sft
from dapo_jax.train import prefilter as prefilter_lib
from dapo_jax.train import state as state_lib
from dapo_jax.train import train_step as train_step_lib

@dataclasses.dataclass(frozen=True)
class ModelParts:
  """The policy's built parts beside its weights."""
  graphdef: nnx.GraphDef
  model_config: ModelConfig
  optimizer: optax.GradientTransformation
  ref_params: nnx.State | None      # the frozen reference policy (algo.kl_coef > 0)
  frozen: nnx.State | None = None   # LoRA: the base weights the adapters adapt (never updated)
  base: adapters.BaseRef | None = None  # LoRA: where that base is on disk, its checksum


@dataclasses.dataclass
class LoopState:
  """What the training loop changes, in one place (a checkpoint saves and restores it)."""
  state: state_lib.TrainState       # params, optimizer state, applied-update count
  step: int = 0                     # rollout steps done
  bad_steps: int = 0                # consecutive steps whose every update was skipped
  first_length: float | None = None  # the first step's mean response length (health checks)
  length_history: dict = dataclasses.field(default_factory=dict)  # by step, adaptive L_cache
  paging: PagingTally = dataclasses.field(default_factory=PagingTally)  # this step's rounds


@dataclasses.dataclass(frozen=True)
class Run:
  """A run's parts, built once by `build` and not replaced: the loop changes only `loop` (and
  the internal positions of `data`, `sampler` and `prefilter`)."""
  cfg: Config
  workdir: str
  mesh: jax.sharding.Mesh           # the trainer's (data x fsdp x tensor)
  placement: placement.Placement    # which devices train and which sample
  task: setup.Task
  model: ModelParts
  sampler: GroupSampler             # its own bf16/f32 copy of the weights, on its own mesh
  data: PromptIterator
  prefilter: prefilter_lib.Prefilter | None  # algo.prefilter's records
  loop: LoopState


def _build_sampler(cfg: Config, model, mcfg, placed: placement.Placement) -> GroupSampler:
  """The sampler owns its copy of the weights, moved device-to-device in its dtype onto its
  own mesh (its devices: every chip, or its share of a split; replicas x tensor); with several
  processes each host drives its own devices. Its slots and pages come from the KV-cache budget
  (rollout.kv_cache_gib, num_slots)."""
  sampler_mesh = placement.build_sampler_mesh(cfg, placed.local_sampler())
  return budget.build_sampler(cfg, model, mcfg, sampler_mesh)


def _warm_start(cfg: Config, graphdef, params, task, mesh):
  return sft.warm_start(
      graphdef, params, task.train, task.tokenizer, steps=cfg.warm_start.steps,
      batch_size=cfg.warm_start.batch_size, lr=cfg.warm_start.lr, seq_len=cfg.seq_len,
      eos_id=task.eos_ids[0], seed=cfg.seed, data_sharding=sharding.data_sharding(mesh),
      use_chat_template=cfg.task.chat_template, demo=setup.demo_fn(cfg))[0]


def build(cfg: Config, workdir: str, *, resume: bool, mesh=None) -> Run:
  placed = placement.place(cfg)
  mesh = placement.build_mesh(cfg, placed.trainer) if mesh is None else mesh
  setup.check_batch_fits_mesh(cfg, mesh)
  task = setup.load_task(cfg)
  model_cfg, reloaded = adapters.build_config(cfg, workdir, setup.resolve_path, resume=resume)
  model, mcfg = setup.build_model(model_cfg, mesh, task.tokenizer)
  graphdef, params = nnx.split(model)
  has_ckpt = resume and checkpoint_dirs.latest(os.path.join(workdir, "checkpoints")) is not None
  if cfg.warm_start.steps and not has_ckpt and not reloaded:
    params = _warm_start(cfg, graphdef, params, task, mesh)
  graphdef, params, frozen, base = adapters.attach(
      cfg, graphdef, params, mesh, workdir=workdir, resolve=setup.resolve_path,
      tokenizer=task.tokenizer, model_config=mcfg, reloaded=reloaded)
  optim = cfg.optim
  optimizer = state_lib.make_optimizer(
      lr=optim.lr, warmup_updates=cfg.warmup_updates, weight_decay=optim.weight_decay,
      grad_clip=optim.grad_clip, b1=optim.b1, b2=optim.b2, eps=optim.eps)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  state = jax.jit(functools.partial(state_lib.create, optimizer=optimizer),
                  out_shardings=state_lib.shardings(params, optimizer, replicated))(params)
  sampler = _build_sampler(cfg, lora.merge(graphdef, lora.join(params, frozen)), mcfg, placed)
  pidx, pcount = setup.process_info()
  data = PromptIterator(task.train, task.tokenizer, batch_size=cfg.prompts_per_round,
                        seed=cfg.seed, max_prompt_len=cfg.task.max_prompt_len,
                        shard_index=pidx, num_shards=pcount,
                        use_chat_template=cfg.task.chat_template)
  ref_params = jax.tree.map(jnp.copy, params) if cfg.algo.kl_coef > 0 else None
  return Run(cfg=cfg, workdir=workdir, mesh=mesh, placement=placed, task=task,
             model=ModelParts(graphdef, mcfg, optimizer, ref_params, frozen, base),
             sampler=sampler, data=data,
             prefilter=prefilter_lib.from_config(cfg.algo, seed=cfg.seed, num_processes=pcount),
             loop=LoopState(state))


def jitted_update(run: Run):
  """The run's `train_step`, jitted once with its state's layout (train_step.jit_train_step):
  (state, minibatch) -> (state, metrics, tokens); under LoRA it reads the frozen base too."""
  frozen = run.model.frozen
  step = train_step_lib.jit_train_step(
      run.cfg, graphdef=run.model.graphdef, optimizer=run.model.optimizer, mesh=run.mesh,
      state_shardings=jax.tree.map(lambda x: x.sharding, run.loop.state),
      frozen_shardings=None if frozen is None else jax.tree.map(lambda x: x.sharding, frozen))
  return step if frozen is None else lambda state, minibatch: step(state, minibatch, frozen)


def policy_params(run: Run, params=None):
  """What the policy's forward reads (`lora.merge`): the loop's params (or `params`: e.g. the
  reference's), with the frozen base under LoRA."""
  return lora.join(run.loop.state.params if params is None else params, run.model.frozen)
