"""Data for dapo_jax: DAPO-Math-17k, eval sets, the synthetic CPU task, tokenizer, prompt batches.

Importing this package is cheap: no TensorFlow, tensorflow-datasets or transformers import happens
until a function needs one. The TFDS builders live in `dapo_jax.data.tfds_builders` (import it to
register them with tfds).
"""
from dapo_jax.data.example import Example, SkipReport, integer_answer
from dapo_jax.data.pipeline import PromptBatch, PromptIterator
from dapo_jax.data.readers import DATASETS, load_examples, read_file, shared_data_dir
from dapo_jax.data.synthetic import SyntheticTask
from dapo_jax.data.template import PREFIX, SUFFIX, make_prompt
from dapo_jax.data.tokenizer import build_synthetic_tokenizer, load_tokenizer

__all__ = [
    "DATASETS", "Example", "PREFIX", "PromptBatch", "PromptIterator", "SUFFIX", "SkipReport",
    "SyntheticTask", "build_synthetic_tokenizer", "integer_answer", "load_examples",
    "load_tokenizer", "make_prompt", "read_file", "shared_data_dir",
]
