"""Turns a validated Config into the run's parts: mesh, tokenizer, datasets, policy model."""
import dataclasses
import functools
import os

import jax

from dapo_jax import sharding
from dapo_jax.workdir import paths
from dapo_jax.config import Config
from dapo_jax.config.sections import (  # noqa: F401  (re-exported: setup.ARCH_FIELDS etc.)
    ARCH_FIELDS, RUN_FIELDS, SOURCE_FIELDS, TRAINER_FIELDS)
from dapo_jax.data import arith_nl, pipeline, readers, synthetic, testbed
from dapo_jax.data import tokenizer as tokenizer_lib
from dapo_jax.models import hf_io, sharded
from dapo_jax.models.config import ModelConfig, family_fields

_EVAL_SETS = ("aime_2024", "aime_2025", "amc_2023", "math_500")
# Tasks generated here (train + held-out split); eval_name "<name>_heldout" is their held-out set.
_GENERATED_TASKS = {"synthetic": synthetic.SyntheticTask, "arith_nl": arith_nl.ArithNLTask}
_HELDOUT_SETS = tuple(f"{name}_heldout" for name in _GENERATED_TASKS)


def check_batch_fits_mesh(cfg: Config, mesh, hosts: int | None = None):
  """The sequences of a mini-batch and of each micro-batch split over the mesh's batch shards,
  and a generation round's prompts over the hosts (default: this run's processes)."""
  shards = sharding.batch_shards(mesh)
  for what, n in (("train.micro_batch_size", cfg.minibatch_seqs // cfg.micro_batches),
                  ("train.batch_size", cfg.minibatch_seqs)):
    if n % shards:
      raise ValueError(f"config.{what}: {n} sequences per (micro-)batch do not split over "
                       f"{shards} data-parallel shards (mesh data x fsdp = {dict(mesh.shape)})")
  hosts = jax.process_count() if hosts is None else hosts
  if cfg.prompts_per_round % hosts:
    raise ValueError(f"config.algo.gen_batch_size: {cfg.prompts_per_round} prompts per round "
                     f"do not split over {hosts} hosts")


@dataclasses.dataclass
class Task:
  train: list                # list[Example]
  eval: list                 # list[Example]
  tokenizer: object          # an HF tokenizer
  eos_ids: tuple

  def decode(self, token_lists):
    """Response texts for the verifier: special tokens (the EOS that ends a sample) dropped,
    else 'Answer: 10<eos>' would not read as an integer."""
    return self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)


def load_task(cfg: Config) -> Task:
  task = cfg.task
  tok = tokenizer_lib.load_tokenizer(None if task.tokenizer == "synthetic" else paths.copy_to_local(
      resolve_path(task.tokenizer), hf_io.TOKENIZER_FILES))  # a bucket's files copied here
  generated = _GENERATED_TASKS.get(task.name)
  if generated is not None:
    if task.shots:  # worked examples in the prompt (arith_nl; config.checks rejects the rest)
      generated = functools.partial(generated, shots=task.shots)
    if task.difficulty_max:  # mixed difficulty (synthetic; config.checks rejects the rest)
      generated = functools.partial(generated, difficulty_max=task.difficulty_max)
    generated = generated(difficulty=task.difficulty, seed=cfg.seed)
    train = generated.examples("train", task.num_train)
  else:
    train, report = readers.load_examples(task.name, data_dir=task.data_dir or None,
                                          skip_bad=task.skip_bad)
    print(f"[data] {task.name}: {report.summary()}")
  evals = _eval_examples(cfg, generated)
  if tok.eos_token_id is None:
    raise ValueError(f"config.task.tokenizer: {task.tokenizer!r} has no EOS token")
  # With the chat template a response ends at the template's end-of-turn token (first) or EOS.
  eos_ids = pipeline.stop_token_ids(tok, use_chat_template=task.chat_template)
  return Task(train=train, eval=evals, tokenizer=tok, eos_ids=eos_ids)


def _eval_examples(cfg: Config, generated) -> list:
  """The eval set of config.task.eval_name (held-out problems of `generated`, the task's
  generator, for a *_heldout set), cut to eval.num_problems."""
  task = cfg.task
  if task.eval_name in _HELDOUT_SETS:
    if task.eval_name != f"{task.name}_heldout":
      raise ValueError(f"config.task.eval_name: {task.eval_name} needs task.name="
                       f"{task.eval_name.removesuffix('_heldout')!r}, got {task.name!r}")
    evals = generated.examples("heldout", cfg.eval.num_problems or 256)
  elif task.eval_name in _EVAL_SETS:
    evals, report = readers.load_examples(task.eval_name, data_dir=task.data_dir or None,
                                          skip_bad=task.skip_bad)
    print(f"[data] {task.eval_name}: {report.summary()}")
  elif task.eval_name == "math_500_easy":  # MATH-500's integer-answer level 1-2 problems
    evals = readers.load_math_500_easy(data_dir=task.data_dir or None)
  elif task.eval_name == "math_500_int":  # MATH-500's non-integer answers rewritten to integers
    from dapo_jax.data import integerize  # pylint: disable=g-import-not-at-top (sympy is slow)
    evals = integerize.load_examples(data_dir=task.data_dir or None)
  else:
    raise ValueError(f"config.task.eval_name: unknown eval set {task.eval_name!r}; expected "
                     f"one of {_HELDOUT_SETS}, math_500_int, math_500_easy or {_EVAL_SETS}")
  return evals[:cfg.eval.num_problems] if cfg.eval.num_problems else evals


def demo_fn(cfg: Config):
  """The warm start's demonstration writer (data/testbed.py), or None for exact references."""
  warm_start = cfg.warm_start
  return testbed.demo_fn({k: getattr(warm_start, k) for k in testbed.DEMO_KNOBS})


def run_overrides(cfg: Config, max_positions: int = 4096) -> dict:
  """ModelConfig fields set by the run whatever the weights' source."""
  out = {f: getattr(cfg.model, f) for f in RUN_FIELDS}
  out["max_position_embeddings"] = max(max_positions, cfg.seq_len)
  return out


def model_config(cfg: Config, vocab_size: int, hf: ModelConfig | None = None) -> ModelConfig:
  """The model's config: from cfg.model (source="config"), or the checkpoint's `hf` config with
  the run settings applied (source="hf")."""
  model = cfg.model
  if hf is not None:
    if model.vocab_size and model.vocab_size != hf.vocab_size:
      raise ValueError(f"config.model.vocab_size: {model.vocab_size} != the checkpoint's "
                       f"{hf.vocab_size} (0 = take the checkpoint's)")
    return dataclasses.replace(hf, **run_overrides(cfg, hf.max_position_embeddings))
  arch = {f: getattr(model, f) for f in ARCH_FIELDS}
  arch["vocab_size"] = model.vocab_size or vocab_size
  return ModelConfig(**arch, **family_fields(model.num_experts), **run_overrides(cfg))


def build_model(cfg: Config, mesh, tokenizer):
  """(model, ModelConfig): a fresh sharded init, or an HF checkpoint loaded onto the mesh."""
  vocab = len(tokenizer)
  if cfg.model.source == "hf":
    path = resolve_path(cfg.model.hf_path)
    mcfg = model_config(cfg, vocab, hf_io.read_config(path))
    model, mcfg = hf_io.load_pretrained(path, mesh=mesh, **{
        f: getattr(mcfg, f) for f in (*RUN_FIELDS, "max_position_embeddings")})
  else:
    mcfg = model_config(cfg, vocab)
    model = sharded.create_sharded_model(mcfg, mesh, seed=cfg.seed)
  if mcfg.vocab_size < vocab:
    raise ValueError(f"config.model.vocab_size: {mcfg.vocab_size} < tokenizer vocabulary {vocab}")
  return model, mcfg


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def resolve_path(path: str) -> str:
  """A URL (gs://...) or an absolute path as it is; a path relative to the working directory,
  or else to the repo root."""
  if paths.is_url(path) or os.path.isabs(path) or os.path.exists(path):
    return path
  return os.path.join(REPO_ROOT, path)


def process_info():
  return jax.process_index(), jax.process_count()

