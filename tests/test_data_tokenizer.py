"""Tests for dapo_jax.data.tokenizer: HF format, AutoTokenizer loading, exact round trips."""
import json

import pytest
import transformers

from dapo_jax.data import template
from dapo_jax.data import tokenizer as tok_lib
from dapo_jax.data.synthetic import SyntheticTask


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  out = tmp_path_factory.mktemp("tok")
  return out, tok_lib.build_synthetic_tokenizer(out)


def test_hf_files_and_autotokenizer(built):
  out, tok = built
  for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    assert (out / name).is_file(), name
  assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == (
      "PreTrainedTokenizerFast")
  again = transformers.AutoTokenizer.from_pretrained(str(out))
  assert len(again) == len(tok) == len(tok_lib.vocabulary())
  assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
  assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == list(tok_lib.SPECIAL_TOKENS)


def test_shipped_tokenizer_is_the_built_one(built):
  out, _ = built
  shipped = tok_lib.SYNTHETIC_TOKENIZER_DIR
  for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
    assert json.loads((shipped / name).read_text()) == json.loads((out / name).read_text()), (
        f"{shipped / name} is stale: rebuild it with "
        "tokenizer.build_synthetic_tokenizer(tokenizer.SYNTHETIC_TOKENIZER_DIR)")
  assert len(tok_lib.load_tokenizer()) == len(tok_lib.vocabulary())


def test_round_trip_task_texts(built):
  _, tok = built
  for digits in (1, 2, 3):
    for difficulty in (1, 3, 8):
      for e in SyntheticTask(difficulty, seed=3, digits=digits).examples("train", 20):
        for text in (e.prompt, e.solution, e.problem):
          ids = tok.encode(text, add_special_tokens=False)
          assert tok.decode(ids) == text
          assert tok.unk_token_id not in ids
        # With <bos> added, skip_special_tokens gives the text back.
        ids = tok.encode(e.prompt)
        assert ids[0] == tok.bos_token_id
        assert tok.decode(ids, skip_special_tokens=True) == e.prompt


def test_round_trip_odd_ascii_and_unk(built):
  _, tok = built
  for text in ["  a  b\n\n\nthere the  The", "Answer:14", "x\ty", "the\n\nthe", "\\boxed{42}",
               "".join(chr(c) for c in range(0x20, 0x7F)) + "\n"]:
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, repr(text)
  assert tok.encode("é", add_special_tokens=False) == [tok.unk_token_id]


def test_token_granularity(built):
  _, tok = built
  digit_ids = [tok.encode(str(d), add_special_tokens=False) for d in range(10)]
  assert all(len(i) == 1 for i in digit_ids) and len({i[0] for i in digit_ids}) == 10
  ids = tok.encode("12+7=19\nAnswer: 19", add_special_tokens=False)
  assert tok.convert_ids_to_tokens(ids) == [
      "1", "2", "+", "7", "=", "1", "9", "\n", "Answer", ":", " ", "1", "9"]
  # Words are whole tokens only when complete: "there" is not " the" + "re".
  assert tok.convert_ids_to_tokens(tok.encode(" there", add_special_tokens=False))[0] == " "
  # The templated prompt is ~60 tokens, not one per character.
  prompt_len = len(tok.encode(template.make_prompt("Compute 3+8-5+9+1."), add_special_tokens=False))
  assert prompt_len <= 72 < len(template.make_prompt(""))


def test_load_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="not an HF tokenizer directory"):
    tok_lib.load_tokenizer(tmp_path)
