"""Data for dapo_jax: DAPO-Math-17k, eval sets, the synthetic CPU task, tokenizer, prompt batches.

Importing this package is cheap: names resolve on first use, and no TensorFlow, tensorflow-datasets
or transformers import happens until a function needs one (which also lets the modules run with
`python -m dapo_jax.data.<module>` cleanly). The TFDS builders live in
`dapo_jax.data.tfds_builders` (import it to register them with tfds).
"""
import importlib

_EXPORTS = {
    "Example": "example", "SkipReport": "example", "integer_answer": "example",
    "PromptBatch": "pipeline", "PromptIterator": "pipeline",
    "DATASETS": "readers", "load_examples": "readers", "read_file": "readers",
    "shared_data_dir": "readers",
    "SyntheticTask": "synthetic",
    "PREFIX": "template", "SUFFIX": "template", "make_prompt": "template",
    "build_synthetic_tokenizer": "tokenizer", "load_tokenizer": "tokenizer",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'dapo_jax.data' has no attribute {name!r}")
  return getattr(importlib.import_module(f"dapo_jax.data.{_EXPORTS[name]}"), name)
