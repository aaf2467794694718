"""A small tokenizer for the synthetic task, in Hugging Face format.

Built with `tokenizers` (a word-level model over a fixed vocabulary) and saved as tokenizer.json +
tokenizer_config.json + special_tokens_map.json, so it loads through the same call as a real
checkpoint's tokenizer: transformers.AutoTokenizer.from_pretrained(local_dir).

Vocabulary: the special tokens, each printable ASCII character, newline and tab on its own (so
digits and operators are single tokens and any ASCII text round-trips), a double newline, and the
words of the DAPO template and the task as whole tokens, with and without a leading space
(" answer"), which keeps the templated prompt near 70 tokens instead of ~250 characters.
Non-ASCII characters map to <unk>.
"""
import json
import pathlib
import re

from dapo_jax.data import template

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)  # ids 0..3 in this order
TASK_WORDS = ("Compute", "Answer")  # words the synthetic task writes besides the template's
SYNTHETIC_TOKENIZER_DIR = pathlib.Path(__file__).resolve().parent / "assets" / "synthetic_tokenizer"


def vocabulary() -> list[str]:
  """The token strings, in id order."""
  chars = ["\n", "\t"] + [chr(c) for c in range(0x20, 0x7F)]
  words = sorted(set(re.findall(r"[A-Za-z]+", template.PREFIX + template.SUFFIX))
                 | set(TASK_WORDS))
  word_tokens = [w for word in words for w in (word, " " + word) if len(w) > 1]
  return list(SPECIAL_TOKENS) + chars + ["\n\n"] + word_tokens


def _split_pattern(words: list[str]) -> str:
  # Longest alternatives first; a word only counts when no letter follows ("the" not in "there");
  # anything else is one character ([\s\S] so that "\n" matches too).
  alts = sorted(words, key=len, reverse=True)
  return "\n\n|(?:" + "|".join(re.escape(w) for w in alts) + r")(?![A-Za-z])|[\s\S]"


def build_synthetic_tokenizer(out_dir):
  """Builds the tokenizer, saves it in HF format under out_dir, returns it loaded from there."""
  import tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers import (  # pylint: disable=g-import-not-at-top
      decoders, models, pre_tokenizers, processors)
  import transformers  # pylint: disable=g-import-not-at-top

  vocab = vocabulary()
  ids = {tok: i for i, tok in enumerate(vocab)}
  words = [t for t in vocab if t not in SPECIAL_TOKENS and len(t) > 1 and t != "\n\n"]
  tok = tokenizers.Tokenizer(models.WordLevel(vocab=ids, unk_token=UNK))
  tok.pre_tokenizer = pre_tokenizers.Split(
      tokenizers.Regex(_split_pattern(words)), behavior="isolated")
  tok.decoder = decoders.Fuse()  # concatenate pieces as they are: no spaces added or removed
  tok.add_special_tokens(list(SPECIAL_TOKENS))
  # Like a base model's tokenizer, encode(add_special_tokens=True) starts the prompt with <bos>.
  tok.post_processor = processors.TemplateProcessing(
      single=f"{BOS} $A", pair=f"{BOS} $A $B:1", special_tokens=[(BOS, ids[BOS])])
  fast = transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
      clean_up_tokenization_spaces=False, model_max_length=4096)
  out_dir = pathlib.Path(out_dir)
  fast.save_pretrained(str(out_dir))
  # transformers 5 writes its own class name ("TokenizersBackend"); the alias it shares with
  # transformers 4 keeps the directory loadable by either.
  config_path = out_dir / "tokenizer_config.json"
  config = json.loads(config_path.read_text())
  config["tokenizer_class"] = "PreTrainedTokenizerFast"
  config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  # Older loaders read the special tokens from this file; newer ones keep them in the config.
  (out_dir / "special_tokens_map.json").write_text(json.dumps(
      {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}, indent=2) + "\n")
  return load_tokenizer(out_dir)


def load_tokenizer(path=None):
  """transformers.AutoTokenizer from a local HF directory (default: the shipped synthetic one)."""
  import transformers  # pylint: disable=g-import-not-at-top
  path = pathlib.Path(path) if path is not None else SYNTHETIC_TOKENIZER_DIR
  if not (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
    raise FileNotFoundError(f"{path}: no tokenizer.json / tokenizer_config.json (not an HF "
                            "tokenizer directory)")
  return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)
