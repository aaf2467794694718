"""Hugging Face checkpoints in and out: safetensors (one file or index + shards) <-> Qwen2.

Loading reads one tensor at a time and places it straight into its target sharding (stacked
layer weights are filled one layer slice at a time, in place), so host memory peaks at about
one tensor (one layer's experts of one projection for a MoE model), never the model.
Reading the directory's files is `hf_files`; the name map is `hf_names`.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from etils.epath import Path  # a local directory or a URL (gs://...): dapo_jax.workdir.paths
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from dapo_jax.workdir import paths, remote_safetensors
from dapo_jax import sharding as shd
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.hf_files import (INDEX_FILE, check_tokenizer, read_config, read_tensor,
                                      resolve_path, tensor_files, tokenizer_vocab_size)
from dapo_jax.models.hf_names import ignorable, tensor_specs
from dapo_jax.models.qwen2 import Qwen2

__all__ = ["INDEX_FILE", "TOKENIZER_FILES", "check_tokenizer", "load_pretrained",
           "read_config", "resolve_path", "save_pretrained", "tensor_files",
           "tokenizer_vocab_size"]
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                "qk_norm", "architecture", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob", "decoder_sparse_step",
                "mlp_only_layers")


# ----- reading ------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _zeros_fn(shape, dtype, sharding):
  return jax.jit(lambda: jnp.zeros(shape, dtype), out_shardings=sharding)


@functools.lru_cache(maxsize=None)
def _set_layer_fn(sharding):
  return jax.jit(lambda s, x, i: jax.lax.dynamic_update_index_in_dim(s, x, i, 0),
                 out_shardings=sharding, donate_argnums=0)


def _layer_sharding(sharding):
  if isinstance(sharding, NamedSharding):
    return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
  return sharding


def load_pretrained(path: str | os.PathLike, *, mesh: Mesh | None = None,
                    dtype: str = "float32", param_dtype: str | None = None,
                    rules=shd.DEFAULT_RULES, **overrides) -> tuple[Qwen2, ModelConfig]:
  """Loads an HF checkpoint (local dir or hub id) into a (sharded) Qwen2 -> (model, config).

  `dtype` is the compute dtype and, unless `param_dtype` is given, the parameter dtype;
  `overrides` set other ModelConfig fields (e.g. remat=True, logits_chunk=256).
  """
  path = resolve_path(path)
  cfg = read_config(path, dtype=dtype, param_dtype=param_dtype or dtype, **overrides)
  check_tokenizer(path, cfg)
  files = tensor_files(path)
  abstract = nnx.eval_shape(lambda: Qwen2(cfg, rngs=nnx.Rngs(0)))
  if mesh is None:
    one = SingleDeviceSharding(jax.devices()[0])
    shardings = jax.tree.map(lambda v: v.replace(one), nnx.state(abstract),
                             is_leaf=lambda x: isinstance(x, nnx.Variable))
  else:
    shardings = shd.model_shardings(abstract, mesh, rules)
  targets = dict(nnx.to_flat_state(shardings))
  variables = dict(nnx.to_flat_state(nnx.state(abstract)))
  pdt = np.dtype(jnp.dtype(cfg.param_dtype))
  arrays, used = {}, set()
  with contextlib.ExitStack() as stack:
    handles = {"_stack": stack}

    def read(name, want):
      used.add(name)
      return read_tensor(handles, files, name, want, pdt)

    for spec in tensor_specs(cfg):
      sds = variables[spec.path].get_value()
      sharding = targets[spec.path].get_value()
      arrays[spec.path] = _load_one(spec, sds, sharding, read, files.__contains__)
  unused = sorted(n for n in files if n not in used and not ignorable(n, cfg))
  if unused:
    raise ValueError(f"checkpoint {path} has {len(unused)} tensor(s) this "
                     f"{cfg.architecture} config does not use, e.g. {unused[:5]}")
  state = nnx.from_flat_state(
      [(p, v.replace(arrays[p])) for p, v in nnx.to_flat_state(nnx.state(abstract))])
  return nnx.merge(nnx.graphdef(abstract), state), cfg


def _place(x: np.ndarray, sharding):
  """Host array -> device array with `sharding`; each device copies only its own shard
  (and, multi-host, each process only its addressable ones)."""
  if isinstance(x, remote_safetensors.LazyTensor):  # behind a URL: each host reads its rows
    return x.place(sharding)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _load_one(spec, sds, sharding, read, has):
  """One parameter: read whole, or layer by layer into its stacked sharded array."""
  if not spec.layered:
    return _place(spec.load(read, has, None, tuple(sds.shape)), sharding)
  n, per_layer = sds.shape[0], tuple(sds.shape[1:])
  out = _zeros_fn(tuple(sds.shape), sds.dtype, sharding)()
  set_layer = _set_layer_fn(sharding)
  layer_sharding = _layer_sharding(sharding)
  for i in range(n):
    x = spec.load(read, has, i, per_layer)
    out = set_layer(out, _place(x, layer_sharding), jnp.int32(i))
  return out


# ----- writing ------------------------------------------------------------------------------
def to_host(x) -> np.ndarray:
  """The whole array on the host (gathered across processes when multi-host)."""
  if jax.process_count() > 1 and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _check_save_args(model: Qwen2, cfg: ModelConfig, tokenizer_dir, max_shard_bytes: int):
  for f in _ARCH_FIELDS:
    if getattr(model.cfg, f) != getattr(cfg, f):
      raise ValueError(f"model_config.{f}={getattr(cfg, f)!r} does not match the model's "
                       f"{getattr(model.cfg, f)!r}")
  if max_shard_bytes <= 0:
    raise ValueError(f"max_shard_bytes must be > 0, got {max_shard_bytes}")
  if tokenizer_dir is not None:
    if not any((Path(tokenizer_dir) / f).is_file()
               for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
      raise ValueError(f"tokenizer_dir {tokenizer_dir} holds no tokenizer "
                       "(tokenizer.json, tokenizer.model or vocab.json)")
    check_tokenizer(tokenizer_dir, cfg)


def _export_items(model: Qwen2, cfg: ModelConfig) -> list:
  """(HF tensor name, host-array getter, bytes) per tensor; stacked layers split per layer
  (and experts per expert)."""
  flat = dict(nnx.to_flat_state(nnx.state(model)))
  items = []
  for spec in tensor_specs(cfg):
    arr = flat[spec.path].get_value()
    for name, index, to_hf in spec.export_parts(tuple(arr.shape)):
      nbytes = arr.nbytes // int(np.prod(arr.shape[:len(index)], dtype=np.int64))
      items.append((name, lambda a=arr, i=index, f=to_hf: f(to_host(a[i] if i else a)), nbytes))
  return items


def _plan_shards(items: list, max_shard_bytes: int) -> list[tuple[str, list]]:
  """Consecutive items grouped into files of at most max_shard_bytes (HF's shard names)."""
  shards, cur, size = [], [], 0
  for item in items:
    if cur and size + item[2] > max_shard_bytes:
      shards.append(cur)
      cur, size = [], 0
    cur.append(item)
    size += item[2]
  shards.append(cur)
  names = (["model.safetensors"] if len(shards) == 1 else
           [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))])
  return list(zip(names, shards))


def save_pretrained(model: Qwen2, model_config: ModelConfig, path: str | os.PathLike, *,
                    tokenizer_dir: str | os.PathLike | None = None,
                    max_shard_bytes: int = 5 * 2**30, overwrite: bool = False):
  """Writes an HF-loadable directory: config.json, safetensors (+ index), tokenizer files.

  Tensors are fetched one at a time and written in shards of at most `max_shard_bytes`, so
  host memory peaks at about one shard. Tokenizer files are copied from `tokenizer_dir`.
  Every process fetches (the arrays may span processes); process 0 writes.
  """
  cfg = model_config
  _check_save_args(model, cfg, tokenizer_dir, max_shard_bytes)
  hf_config = cfg.to_hf_dict()
  # The dtype written is the parameters' actual one (what the safetensors hold).
  actual = jnp.dtype(nnx.state(model)["embed"].get_value().dtype).name
  hf_config["dtype"] = hf_config["torch_dtype"] = actual
  path = Path(path)
  old = sorted(path.glob("*.safetensors")) + sorted(path.glob(INDEX_FILE))
  if old and not overwrite:
    raise ValueError(f"{path} already holds a checkpoint ({old[0].name}); "
                     "pass overwrite=True to replace it")
  write = jax.process_index() == 0
  if write:
    path.mkdir(parents=True, exist_ok=True)
    for f in old:
      f.unlink()
  items = _export_items(model, cfg)
  shards = _plan_shards(items, max_shard_bytes)
  weight_map = {}
  for fname, shard in shards:
    tensors = {name: get() for name, get, _ in shard}
    if write:
      remote_safetensors.save_file(tensors, path / fname, metadata={"format": "pt"})
    weight_map.update({name: fname for name in tensors})
    del tensors
  if not write:
    return
  if len(shards) > 1:
    total = sum(b for _, _, b in items)
    (path / INDEX_FILE).write_text(json.dumps(
        {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
  (path / "config.json").write_text(json.dumps(hf_config, indent=2))
  if tokenizer_dir is not None:
    for f in TOKENIZER_FILES:
      if (Path(tokenizer_dir) / f).is_file():
        paths.copy_file(Path(tokenizer_dir) / f, path / f)
