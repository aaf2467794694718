"""Tests for dapo_jax.data.contamination: n-gram overlap values and the report command."""
import json

import pytest

from dapo_jax.data import contamination
from dapo_jax.data.example import Example


def _ex(i, problem, answer="1"):
  return Example(id=str(i), problem=problem, prompt=problem, answer=answer)


WORDS = [f"w{i}" for i in range(40)]


def test_words_normalise_markup_and_case():
  assert contamination.words(r"Find $\frac{A}{B}$, the VALUE!") == [
      "find", "frac", "a", "b", "the", "value"]
  assert contamination.words("ｆｕｌｌ width") == ["full", "width"]  # NFKC


def test_overlap_values_by_hand():
  train = [_ex(0, " ".join(WORDS[:15])), _ex(1, " ".join(WORDS[30:40]))]
  # 20 words -> 8 distinct 13-grams; the 3 starting at words 0, 1, 2 lie inside train item 0.
  partial = _ex("p", " ".join(WORDS[:20]))
  copy = _ex("c", "$" + " ".join(WORDS[:15]).upper() + "$.", answer="2")
  other = _ex("o", " ".join(reversed(WORDS[:20])))
  short_in = _ex("s", " ".join(WORDS[32:36]), answer="1")  # 4 words, inside train item 1
  short_out = _ex("t", "w36 w32")
  res = {r.eval_id: r for r in contamination.check(
      train, {"ev": [partial, copy, other, short_in, short_out]}, n=13)}
  assert res["p"].overlap == pytest.approx(3 / 8) and res["p"].best_train_id == "0"
  assert res["c"].overlap == 1.0 and res["c"].best_share == 1.0 and not res["c"].answers_agree
  assert res["o"].overlap == 0.0 and res["o"].best_train_id is None
  assert res["s"].short and res["s"].overlap == 1.0 and res["s"].best_train_id == "1"
  assert res["s"].answers_agree
  assert res["t"].short and res["t"].overlap == 0.0
  # With n = 5 the partial item shares 11 of its 16 five-grams.
  res5 = {r.eval_id: r for r in contamination.check(train, {"ev": [partial]}, n=5)}
  assert res5["p"].overlap == pytest.approx(11 / 16)


def test_report_lists_items_over_threshold():
  train = [_ex(0, " ".join(WORDS[:15]))]
  evals = {"a": [_ex("p", " ".join(WORDS[:20])), _ex("c", " ".join(WORDS[:15]))],
           "b": [_ex("x", " ".join(WORDS[20:40]))]}
  results = contamination.check(train, evals, n=13)
  text = contamination.format_report(results, train_name="t", n_train=1, n=13, threshold=0.3)
  assert "| a | 2 | 2 | 2 | 2 | 1.00 | 0 |" in text
  assert "| b | 1 | 0 | 0 | 0 | 0.00 | 0 |" in text
  assert "Items with overlap >= 0.3: 2" in text and "a id c: overlap 1.00" in text
  text = contamination.format_report(results, train_name="t", n_train=1, n=13, threshold=0.5)
  assert "Items with overlap >= 0.5: 1" in text and "a id p" not in text


def test_bad_arguments():
  with pytest.raises(ValueError, match="n: expected an int >= 1"):
    contamination.check([_ex(0, "a b")], {"e": []}, n=0)
  with pytest.raises(ValueError, match="threshold: expected a fraction"):
    contamination.format_report([], train_name="t", n_train=0, n=13, threshold=1.5)


def test_cli_on_shared_data(tmp_path, capsys):
  out_json = tmp_path / "overlap.json"
  contamination.main(["--train", "dapo_math_17k", "--eval", "aime_2024,amc_2023", "--n", "13",
                      "--threshold", "0.5", "--json", str(out_json)])
  text = capsys.readouterr().out
  assert "Train: dapo_math_17k (" in text and "| aime_2024 | 30 |" in text
  assert "| amc_2023 | 40 |" in text
  rows = json.loads(out_json.read_text())
  assert len(rows) == 70 and {r["eval_set"] for r in rows} == {"aime_2024", "amc_2023"}
  flagged = [r for r in rows if r["overlap"] >= 0.5]
  assert f"Items with overlap >= 0.5: {len(flagged)}" in text
