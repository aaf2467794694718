"""A Hugging Face checkpoint's config.json and tokenizer read and checked against the model
(dapo_jax.models.hf_io re-exports read_config): errors name the file."""
from __future__ import annotations

import json
import os

from etils.epath import Path  # a local directory or a URL (gs://...): dapo_jax.paths

from dapo_jax.models.config import ModelConfig


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
