"""Hugging Face checkpoints in and out: safetensors (one file or index + shards) <-> Qwen2.

Loading reads one tensor at a time and places it straight into its target sharding (stacked
layer weights are filled one layer slice at a time, in place), so host memory peaks at about
one tensor, never the model.
"""
from __future__ import annotations

import contextlib
import functools
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
from etils.epath import Path  # a local directory or a URL (gs://...): dapo_jax.paths
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding
from safetensors import SafetensorError, safe_open

from dapo_jax import paths, remote_safetensors
from dapo_jax import sharding as shd
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.hf_names import TensorSpec, ignorable, tensor_specs
from dapo_jax.models.qwen2 import Qwen2

INDEX_FILE = "model.safetensors.index.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
_ARCH_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                "num_kv_heads", "head_dim", "tie_word_embeddings", "attention_bias",
                "qk_norm", "architecture")


# ----- reading ------------------------------------------------------------------------------
def read_config(path: str | os.PathLike, **overrides) -> ModelConfig:
  """ModelConfig from `path`/config.json (errors name the file)."""
  file = Path(path) / "config.json"
  if not file.is_file():
    raise ValueError(f"no config.json in checkpoint directory {path}")
  try:
    d = json.loads(file.read_text())
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{file}: not valid JSON ({e})") from e
  if not isinstance(d, dict):
    raise ValueError(f"{file}: expected a JSON object, got {type(d).__name__}")
  try:
    return ModelConfig.from_hf_dict(d, **overrides)
  except KeyError as e:
    raise ValueError(f"{file}: missing required key {e}") from e
  except (ValueError, TypeError) as e:
    raise ValueError(f"{file}: {e}") from e


def tokenizer_vocab_size(path: str | os.PathLike) -> int | None:
  """Tokens the tokenizer in `path` can emit (incl. added tokens), or None if it has none."""
  path = Path(path)
  if (path / "tokenizer.json").is_file():
    from tokenizers import Tokenizer
    try:
      return Tokenizer.from_str((path / "tokenizer.json").read_text()).get_vocab_size(
          with_added_tokens=True)
    except Exception as e:  # tokenizers raises a bare Exception on malformed files
      raise ValueError(f"{path / 'tokenizer.json'}: cannot be read ({e})") from e
  if (path / "vocab.json").is_file():
    try:
      ids = list(json.loads((path / "vocab.json").read_text()).values())
      if (path / "added_tokens.json").is_file():
        ids += list(json.loads((path / "added_tokens.json").read_text()).values())
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
      raise ValueError(f"{path}: vocab.json/added_tokens.json not valid ({e})") from e
    return max(ids) + 1
  return None


def check_tokenizer(path: str | os.PathLike, cfg: ModelConfig):
  """A tokenizer that can emit ids >= vocab_size would index past the embedding table."""
  n = tokenizer_vocab_size(path)
  if n is not None and n > cfg.vocab_size:
    raise ValueError(f"vocab mismatch: the tokenizer in {path} has {n} tokens but the model "
                     f"config has vocab_size={cfg.vocab_size}")


def tensor_files(path: str | os.PathLike) -> dict[str, Path]:
  """HF tensor name -> safetensors file, from the index file or by scanning the shards."""
  path = Path(path)
  index = path / INDEX_FILE
  if index.is_file():
    try:
      weight_map = json.loads(index.read_text())["weight_map"]
    except (json.JSONDecodeError, KeyError, TypeError) as e:
      raise ValueError(f"{index}: not a valid safetensors index ({e!r})") from e
    out = {name: path / f for name, f in weight_map.items()}
    for f in sorted(set(out.values())):
      if not f.is_file():
        raise ValueError(f"{index} lists shard {f.name}, which is missing from {path}")
    return out
  files = sorted(path.glob("*.safetensors"))
  if not files:
    raise ValueError(f"no *.safetensors files (and no {INDEX_FILE}) in {path}")
  out = {}
  for f in files:
    with _open(f) as h:
      for name in h.keys():
        if name in out:
          raise ValueError(f"tensor {name!r} appears in both {out[name].name} and {f.name}")
        out[name] = f
  return out


@contextlib.contextmanager
def _open(file: Path):
  try:
    handle = (remote_safetensors.RemoteFile(file) if paths.is_url(file) else
              safe_open(str(file), framework="numpy"))
  except (SafetensorError, OSError) as e:
    raise ValueError(f"corrupt or unreadable safetensors file {file}: {e}") from e
  with handle as h:
    yield h


def _read(handles: dict, files: dict[str, Path], name: str, want: tuple[int, ...], dtype):
  """One tensor as numpy in `dtype`, after checking it exists and has HF shape `want`."""
  if name not in files:
    raise ValueError(f"missing tensor {name!r} in checkpoint {_dir(files)}")
  file = files[name]
  if file not in handles:
    handles[file] = handles["_stack"].enter_context(_open(file))
  h = handles[file]
  try:
    got = tuple(h.get_slice(name).get_shape())
  except SafetensorError as e:
    raise ValueError(f"tensor {name!r} is not readable from {file}: {e}") from e
  if got != want:
    raise ValueError(f"shape mismatch for tensor {name!r} in {file}: checkpoint has {got}, "
                     f"the config implies {want}")
  try:
    return h.get_tensor(name).astype(dtype, copy=False)
  except (SafetensorError, ValueError, TypeError) as e:
    raise ValueError(f"corrupt tensor {name!r} in {file}: {e}") from e


def _dir(files: dict[str, Path]) -> str:
  return str(next(iter(files.values())).parent) if files else "?"


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


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja"]


def resolve_path(path: str | os.PathLike) -> Path:
  """A local checkpoint dir, or a hub id ("org/name") fetched with huggingface_hub."""
  local = Path(path)
  if local.is_dir():
    return local
  if local.exists() or not _HUB_ID.fullmatch(str(path)):
    raise ValueError(f"checkpoint path {path} is not a directory")
  import huggingface_hub  # only needed for hub ids
  try:
    return Path(huggingface_hub.snapshot_download(str(path), allow_patterns=_HUB_PATTERNS))
  except Exception as e:  # offline, unknown repo, auth: all end the same way
    raise ValueError(f"checkpoint path {path} is not a local directory and fetching it as a "
                     f"hub id failed ({type(e).__name__}: {e})") from e


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
    for spec in tensor_specs(cfg):
      sds = variables[spec.path].get_value()
      sharding = targets[spec.path].get_value()
      arrays[spec.path] = _load_one(spec, sds, sharding, handles, files, pdt, used)
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


def _load_one(spec: TensorSpec, sds, sharding, handles, files, pdt, used):
  if not spec.layered:
    shape = tuple(sds.shape)
    x = _read(handles, files, spec.name(None), spec.hf_shape(shape), pdt)
    used.add(spec.name(None))
    return _place(spec.to_ours(x, shape), sharding)
  n, per_layer = sds.shape[0], tuple(sds.shape[1:])
  out = _zeros_fn(tuple(sds.shape), sds.dtype, sharding)()
  set_layer = _set_layer_fn(sharding)
  layer_sharding = _layer_sharding(sharding)
  for i in range(n):
    x = _read(handles, files, spec.name(i), spec.hf_shape(per_layer), pdt)
    used.add(spec.name(i))
    out = set_layer(out, _place(spec.to_ours(x, per_layer), layer_sharding), jnp.int32(i))
  return out


# ----- writing ------------------------------------------------------------------------------
def _host(x) -> np.ndarray:
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
  """(HF tensor name, host-array getter, bytes) per tensor; stacked layers split per layer."""
  flat = dict(nnx.to_flat_state(nnx.state(model)))
  items = []
  for spec in tensor_specs(cfg):
    arr = flat[spec.path].get_value()
    layers = range(arr.shape[0]) if spec.layered else [None]
    per = arr.nbytes // (arr.shape[0] if spec.layered else 1)
    for i in layers:
      get = (lambda a=arr, s=spec: s.to_hf(_host(a))) if i is None else (
          lambda a=arr, s=spec, i=i: s.to_hf(_host(a[i])))
      items.append((spec.name(i), get, per))
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
