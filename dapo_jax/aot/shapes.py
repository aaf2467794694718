"""Abstract shapes of a run: the model config, parameters and train state, with no weights read.

The architecture comes from the config (model.source="config"), from the checkpoint's
config.json when model.source="hf" and the file is there, else from a named preset matching
the checkpoint directory's name (so a pod run can be checked before the weights are copied).
"""
import dataclasses
import functools
import os

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.models import hf_io, lora
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.train import setup
from dapo_jax.train import state as state_lib

# HF config.json values of public checkpoints (architecture only).
PRESETS = {
    "qwen2.5-32b": dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648,
                        num_layers=64, num_heads=40, num_kv_heads=8, head_dim=128,
                        rope_theta=1e6, tie_word_embeddings=False,
                        max_position_embeddings=131072),
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                       num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                       rope_theta=1e6, tie_word_embeddings=False,
                       max_position_embeddings=131072),
    "qwen3-30b-a3b-base": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                               num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
                               rope_theta=1e6, tie_word_embeddings=False,
                               max_position_embeddings=32768, architecture="qwen3_moe",
                               qk_norm=True, attention_bias=False, num_experts=128,
                               num_experts_per_tok=8, moe_intermediate_size=768,
                               norm_topk_prob=True),
}


def _vocab_from_tokenizer(cfg: Config) -> int:
  from dapo_jax.data import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  t = cfg.task.tokenizer
  return len(tokenizer_lib.load_tokenizer(None if t == "synthetic" else setup.resolve_path(t)))


def model_config(cfg: Config) -> tuple[ModelConfig, str]:
  """(ModelConfig with the run's settings applied, where the architecture came from)."""
  model = cfg.model
  if model.source == "config":
    vocab = model.vocab_size or _vocab_from_tokenizer(cfg)
    return setup.model_config(cfg, vocab), "config"
  path = setup.resolve_path(model.hf_path)
  if os.path.isfile(os.path.join(path, "config.json")):
    return setup.model_config(cfg, 0, hf_io.read_config(path)), f"{path}/config.json"
  name = os.path.basename(os.path.normpath(model.hf_path)).lower()
  if name not in PRESETS:
    raise ValueError(f"config.model.hf_path: no config.json in {path!r} and no preset named "
                     f"{name!r}; known presets: {sorted(PRESETS)}")
  return setup.model_config(cfg, 0, ModelConfig(**PRESETS[name])), f"preset {name}"


def sds(tree, shardings):
  """ShapeDtypeStructs of an abstract tree carrying the given shardings."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


@dataclasses.dataclass
class Model:
  """An abstract model on a mesh: graphdef, the trained params' SDS and their shardings, and
  under LoRA the frozen base's (the params are then the adapters: models/lora.py)."""
  cfg: ModelConfig
  graphdef: object
  params: object            # nnx.State of ShapeDtypeStruct (with sharding)
  shardings: object
  frozen: object = None     # LoRA: the base's nnx.State of ShapeDtypeStruct, else None
  frozen_shardings: object = None

  @property
  def rest(self):
    """What an Engine holds beside its synced params (device_fns' `rest`): the frozen base
    under LoRA, else nothing."""
    return {} if self.frozen is None else self.frozen


def _cast(tree, dtype):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.dtype(dtype)), tree)


def abstract_model(mcfg: ModelConfig, mesh, dtype=None, lora_cfg=None,
                   adapter_dtype=None) -> Model:
  """Params as the trainer holds them (param_dtype), or cast to `dtype` (the sampler's). With
  lora_cfg.rank > 0: the adapters (float32, or `adapter_dtype`) train and the base is frozen
  (in param_dtype, or `dtype`)."""
  def build():
    model = Qwen2(mcfg, rngs=nnx.Rngs(0))
    if lora_cfg is not None and lora_cfg.rank:
      lora.attach(model, rank=lora_cfg.rank, alpha=lora_cfg.alpha, targets=lora_cfg.targets,
                  seed=0)
    return model
  abstract = nnx.eval_shape(build)
  every = sharding.model_shardings(abstract, mesh)
  if not lora.has_adapters(abstract):
    graphdef, params, _ = nnx.split(abstract, nnx.Param, ...)
    shard = nnx.filter_state(every, nnx.Param)
    params = params if dtype is None else _cast(params, dtype)
    return Model(cfg=mcfg, graphdef=graphdef, params=sds(params, shard), shardings=shard)
  graphdef, params, frozen = nnx.split(abstract, lora.LoraParam, ...)
  shard, fshard = nnx.split_state(every, lora.LoraParam, ...)
  params = params if adapter_dtype is None else _cast(params, adapter_dtype)
  frozen = frozen if dtype is None else _cast(frozen, dtype)
  return Model(cfg=mcfg, graphdef=graphdef, params=sds(params, shard), shardings=shard,
               frozen=sds(frozen, fshard), frozen_shardings=fshard)


def train_state(cfg: Config, model: Model, mesh):
  """(optimizer, init function, state SDS) with the shardings train.run.build gives the state."""
  optim = cfg.optim
  optimizer = state_lib.make_optimizer(
      lr=optim.lr, warmup_updates=cfg.warmup_updates, weight_decay=optim.weight_decay,
      grad_clip=optim.grad_clip, b1=optim.b1, b2=optim.b2, eps=optim.eps)
  shard = state_lib.shardings(model.params, optimizer, NamedSharding(mesh, P()))
  create = functools.partial(state_lib.create, optimizer=optimizer)
  init = jax.jit(create, out_shardings=shard)
  return optimizer, init, sds(jax.eval_shape(create, model.params), shard)


def bytes_per_chip(tree) -> int:
  """Bytes one chip holds of a tree of sharded ShapeDtypeStructs (the largest shard)."""
  total = 0
  for x in jax.tree.leaves(tree):
    shape = x.sharding.shard_shape(x.shape)
    n = 1
    for d in shape:
      n *= d
    total += n * jnp.dtype(x.dtype).itemsize
  return total
