"""Shared pieces of the benchmarks: the model sizes, a random HF model directory, the host, the
load average, the JSON result and the summary statistics.

Every benchmark script measures ONE side in its own process (JAX never shares a process with
torch: their thread pools fight for the cores). `run_all.py` runs the scripts one after another.
"""
import json
import os
import statistics
import time

MODELS = {
    "tiny": dict(hidden_size=256, intermediate_size=1024, num_layers=4, num_heads=4,
                 num_kv_heads=2, head_dim=64, vocab_size=512),
    "small": dict(hidden_size=512, intermediate_size=2048, num_layers=8, num_heads=8,
                  num_kv_heads=2, head_dim=64, vocab_size=4096),
    # Qwen2.5-0.5B's shapes (494 M parameters), random: the GPU check (device_check.sh).
    "qwen2_0.5b": dict(hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                       num_kv_heads=2, head_dim=64, vocab_size=151936),
}


def loadavg() -> float:
  """The 1-minute load average (other jobs on the machine make every figure noisier)."""
  return os.getloadavg()[0]


def host() -> dict:
  """The CPU these figures came from: model name, core count and the vector extensions that set
  the matmul rate (hosts of the same machine kind differ, and peers gain or lose unevenly)."""
  info = {"cpus": os.cpu_count(), "model": "unknown", "flags": []}
  try:
    with open("/proc/cpuinfo") as f:
      lines = f.read().splitlines()
  except OSError:
    return info
  for line in lines:
    key, _, value = line.partition(":")
    if key.strip() == "model name" and info["model"] == "unknown":
      info["model"] = value.strip()
    elif key.strip() == "flags" and not info["flags"]:
      info["flags"] = sorted(x for x in value.split()
                             if x.startswith(("avx512", "amx")) or x in ("avx2", "fma"))
  return info


def make_model_dir(size: str, path: str, *, max_positions: int = 1024, seed: int = 0) -> str:
  """Writes a random Qwen2 (`MODELS[size]`, tied embeddings) with a WordLevel tokenizer over
  its vocabulary as an HF directory, through dapo_jax's own hf_io (no torch needed)."""
  from flax import nnx  # pylint: disable=g-import-not-at-top
  from dapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
  from dapo_jax.models.qwen2 import ModelConfig, Qwen2  # pylint: disable=g-import-not-at-top
  if size not in MODELS:
    raise ValueError(f"--size: unknown model size {size!r}; one of {sorted(MODELS)}")
  cfg = ModelConfig(**MODELS[size], tie_word_embeddings=True,
                    max_position_embeddings=max_positions)
  model = Qwen2(cfg, rngs=nnx.Rngs(seed))
  tok_dir = os.path.join(path, "_tokenizer")
  write_tokenizer(tok_dir, cfg.vocab_size)
  hf_io.save_pretrained(model, cfg, path, tokenizer_dir=tok_dir, overwrite=True)
  return path


def write_tokenizer(path: str, vocab: int):
  """A WordLevel tokenizer: id i <-> "t{i}" (ids 0-3 are pad / bos / eos / unk)."""
  from tokenizers import Tokenizer, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  names = ["<pad>", "<s>", "</s>", "<unk>"] + [f"t{i}" for i in range(4, vocab)]
  tok = Tokenizer(models.WordLevel({n: i for i, n in enumerate(names)}, unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  os.makedirs(path, exist_ok=True)
  tok.save(os.path.join(path, "tokenizer.json"))
  with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "pad_token": "<pad>",
               "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}, f)


def summary(xs) -> dict:
  """Median and range of repeated measurements."""
  xs = [float(x) for x in xs]
  return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def timed(fn, *args):
  """(result, seconds) of fn(*args), the result made ready first when it is a JAX value."""
  t0 = time.perf_counter()
  out = fn(*args)
  try:
    import jax  # pylint: disable=g-import-not-at-top
    out = jax.block_until_ready(out)
  except ImportError:
    pass
  return out, time.perf_counter() - t0


def write_json(path: str | None, result: dict):
  """Prints the result and, given a path, writes it as JSON."""
  print(json.dumps(result, indent=1, sort_keys=True))
  if path:
    with open(path, "w") as f:
      json.dump(result, f, indent=1, sort_keys=True)
