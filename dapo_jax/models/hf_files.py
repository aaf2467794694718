"""Reading an HF checkpoint directory: config.json, tokenizer size, safetensors files and
tensors (each checked for presence and shape, errors naming the file), and hub ids."""
from __future__ import annotations

import contextlib
import json
import os
import re

from etils.epath import Path  # a local directory or a URL (gs://...): dapo_jax.workdir.paths
from safetensors import SafetensorError, safe_open

from dapo_jax.workdir import paths, remote_safetensors
from dapo_jax.models.config import ModelConfig

INDEX_FILE = "model.safetensors.index.json"


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


def read_tensor(handles: dict, files: dict[str, Path], name: str, want: tuple[int, ...], dtype):
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


