"""The verifier's accepted forms (one test per docstring table row) and the forms it must reject.

Parser functions are called directly here (judge, extract_answer, answer_forms.*): score()'s
counted guard is tested on its own, so no test below can pass because an error was swallowed.
"""
import re

import numpy as np
import pytest

from dapo_jax import rewards
from dapo_jax.rewards import answer_forms, get_reward_fn, math_answer

# Row id of math_answer's docstring table -> (response, ground truth) pairs that must score +1.
ACCEPTED = {
    "plain": [("Answer: 42", "42"), ("Answer: 42", 42)],
    "marker": [("answer :42", "42"), ("ANSWER:42", "42"), ("Answer：42", "42"),
               ("**Answer:** 42", "42"), ("Final answer: 42", "42")],
    "next-line": [("Answer:\n42", "42"), ("Answer:  \n\n  42\nmore", "42"),
                  ("Answer:\n$\\boxed{42}$", "42")],
    "last-wins": [("Answer: 41\nAnswer: 42", "42"), ("work\nAnswer: 5\nmore text", "5")],
    "boxed-fallback": [("so \\boxed{41} ... \\boxed{42}", "42"), ("\\fbox{42}", "42"),
                       ("x" * 5000 + " \\boxed{42} " + "y" * 5000, "42")],
    "math": [("Answer: $42$", "42"), ("Answer: $$42$$", "42"), ("Answer: \\(42\\)", "42"),
             ("Answer: \\[ 42 \\]", "42")],
    "command": [(f"Answer: \\{c}{{42}}", "42")
                for c in ("boxed", "fbox", "text", "textbf", "mathbf", "mathrm", "mbox")],
    "emphasis": [("Answer: **42**", "42"), ("Answer: *42*", "42"), ("Answer: `42`", "42")],
    "trailing": [("Answer: 42.", "42"), ("Answer: $42$.", "42"), ("Answer: 42,", "42"),
                 ("Answer: \\boxed{42}.", "42")],
    "parens": [("Answer: (42)", "42"), ("Answer: $(-3)$", "-3")],
    "degrees": [("Answer: 42^\\circ", "42"), ("Answer: $42^{\\circ}$", "42"),
                ("Answer: 42\\degree", "42"), ("Answer: 42°", "42")],
    "units": [("Answer: 42 degrees", "42"), ("Answer: 42 \\text{ ways}", "42"),
              ("Answer: 42 square units", "42"), ("Answer: $42\\mbox{ cm}$", "42"),
              ("Answer: 42cm", "42")],
    "prefix": [("Answer: x = 42", "42"), ("Answer: AB=42", "42"), ("Answer: x_1 = 42", "42"),
               ("Answer: \\theta = 42", "42"), ("Answer: $\\boxed{n = 42}$.", "42")],
    "thousands": [("Answer: 42,000", "42000"), ("Answer: 1,234", "1234"),
                  ("Answer: 1{,}234", "1234"), ("Answer: 10,\\!080", "10080"),
                  ("Answer: 1\\,234,567", "1234567"), ("Answer: 11,\\! 111,\\! 100", "11111100")],
    "zeros": [("Answer: 042", "42"), ("Answer: 016", "16"), ("Answer: 16", "016"),
              ("Answer: 42.0", "42"), ("Answer: 42.00", "42"), ("Answer: 27", "27.0"),
              ("Answer: 0", "-0")],
    "sign": [("Answer: -3", "-3"), ("Answer: +3", "3"), ("Answer: −3", "-3"),
             ("Answer: - 3", "-3")],
    "unicode-digits": [("Answer: ٤٢", "42"), ("Answer: ４２", "42"), ("Answer: ۴۲", "42"),
                       ("Answer: 42", "٤٢")],
    "currency": [("Answer: \\$42", "42"), ("Answer: \\$32,\\!348", "32348")],
    "non-number-truth": [("Answer: \\frac{1}{2}", "\\frac{1}{2}"),
                         ("Answer: $\\dfrac{1}{2}$.", "\\frac{1}{2}"),
                         ("Answer: (3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"),
                         ("Answer: \\text{Evelyn}", "\\text{evelyn}"), ("Answer: 1, -2", "1,-2")],
}

# Must score −1; ground truth 42 unless given. Strings that try to game the verifier come first.
REJECTED = [
    ("Answer: x = 3 or x = 42", "42"), ("Answer: 41, y = 42", "42"), ("Answer: 3 = 42", "42"),
    ("Answer: 4 2", "42"), ("Answer: 42.5", "42"), ("Answer: 41 42", "42"),
    ("Answer: 41 or 42", "42"), ("Answer: 41, 42", "42"), ("Answer: x = 41 = 42", "42"),
    ("Answer: 4\\,2", "42"), ("Answer: 4,2", "42"), ("Answer: 4~2", "42"), ("Answer: 1,23", "123"),
    ("Answer: the answer is 42", "42"), ("Answer: 4²", "42"), ("Answer: 42 waysx", "42"),
    ("Answer: 4\x002", "42"), ("Answer: 42\x00", "42"), ("\x00Answer: 42", "42"),
    ("Answer: -42", "42"), ("Answer: 43", "42"), ("Answer: (42", "42"),
    ("Answer: x + 1 = 42", "42"),
    ("Answer: 2\nAnswer: 1", "2"), ("Answer: 42\nAnswer:", "42"), ("Answer:", "1"), ("", "1"),
    ("no answer here", "42"), ("\\boxed{42", "42"), ("\\boxed{}", "42"),
    ("Answer: " + "\\boxed{" * 40 + "42" + "}" * 40, "42"),  # deeper than MAX_LAYERS
    ("Answer: " + "0" * answer_forms.MAX_ANSWER_CHARS + "42", "42"),  # longer than allowed
    ("Answer: 0.5", "\\frac{1}{2}"), ("Answer: 7", "\\frac{1}{2}"), ("Answer: 1,2", "(1,2)"),
]


def _cases(table):
  return [pytest.param(text, gt, id=f"{row}-{i}") for row, pairs in table.items()
          for i, (text, gt) in enumerate(pairs)]


@pytest.mark.parametrize("text, gt", _cases(ACCEPTED))
def test_accepted_forms(text, gt):
  assert math_answer.judge(text, str(gt))[0], text
  assert math_answer.score(text, gt)[:2] == (1.0, True)


@pytest.mark.parametrize("text, gt", REJECTED)
def test_rejected_forms(text, gt):
  assert not math_answer.judge(text, gt)[0], text
  assert math_answer.score(text, gt)[:2] == (-1.0, False)


def test_every_docstring_row_has_tests():
  ids = re.findall(r"^\| ([a-z-]+) \|", math_answer.__doc__, re.MULTILINE)
  assert set(ids) - {"id"} == set(ACCEPTED), "table rows and ACCEPTED keys must match"
  assert all(ACCEPTED.values())


def test_extract_answer():
  assert math_answer.extract_answer("foo\nAnswer: 12 apples\n") == "12 apples"
  assert math_answer.extract_answer("Answer:\n\n 7 \nAnswer") == "7"
  assert math_answer.extract_answer("\\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"
  assert math_answer.extract_answer("Answer: \n") is None
  assert math_answer.extract_answer("\\boxed{3} then Answer:") is None  # marker wins, empty
  assert math_answer.extract_answer("nothing") is None


def test_prediction_is_the_raw_answer():
  assert math_answer.score("Answer: $42$.", "42") == (1.0, True, "$42$.")
  assert math_answer.score("Answer: 4\x002", "42") == (-1.0, False, None)


def test_as_number_and_as_integer():
  assert answer_forms.as_number("$-0042.500$") == "-42.5"
  assert answer_forms.as_number("-0.0") == "0"
  assert answer_forms.as_number(".5") == "0.5"
  assert answer_forms.as_number("") is None and answer_forms.as_number(".") is None
  assert answer_forms.as_number("x = 016") == "16"
  assert answer_forms.as_number("3 = 42") is None


def test_huge_numbers_compare_exactly():
  n = "7" * 5000
  assert math_answer.judge("Answer: " + n, n)[0]
  assert not math_answer.judge("Answer: " + n + "1", n)[0]
  assert not math_answer.judge("Answer: " + n[:-1] + "8", n)[0]


def test_ascii_digits_only_maps_decimal_digits():
  assert answer_forms.ascii_digits("٠١٢٣٤٥٦٧٨٩ ０９ ߀") == "0123456789 09 0"
  assert answer_forms.ascii_digits("4² ½ Ⅻ") == "4² ½ Ⅻ"


def test_normalize_string():
  assert math_answer.normalize_string("$\\left( 1, 2 \\right)$") == "(1,2)"
  assert math_answer.normalize_string("\\text{ Evelyn }") == "evelyn"
  assert math_answer.normalize_string("\x00") == ""


@pytest.mark.parametrize("text, gt, err", [
    (None, "3", TypeError), (b"Answer: 3", "3", TypeError), (12345, "3", TypeError),
    ("Answer: 3", None, TypeError), ("Answer: 3", True, TypeError), ("Answer: 3", 3.0, TypeError),
    ("Answer: 3", "", ValueError), ("Answer: 3", "  ", ValueError),
])
def test_caller_bugs_raise_with_the_place(text, gt, err):
  with pytest.raises(err, match="math_answer.score"):
    math_answer.score(text, gt)


def test_parser_errors_are_counted_not_silent(monkeypatch, caplog):
  def broken(text, gt):
    raise RuntimeError("planted parser bug")
  before = rewards.verifier_errors()
  monkeypatch.setattr(math_answer, "judge", broken)
  assert math_answer.score("Answer: 3", "3") == (-1.0, False, None)
  assert rewards.verifier_errors() == before + 1
  assert math_answer.verifier_errors() == before + 1
  if before < math_answer._LOGGED_ERRORS:  # pylint: disable=protected-access
    assert "planted parser bug" in caplog.text


def test_registry():
  assert get_reward_fn("math_answer") is math_answer.score
  with pytest.raises(ValueError, match="unknown reward"):
    get_reward_fn("nope")


def test_error_count_and_logged_tracebacks(monkeypatch, caplog):
  # From a zeroed counter: six planted errors count six; the first _LOGGED_ERRORS are logged by
  # this module's logger with the error number, the rest only counted.
  def broken(text, gt):
    raise RuntimeError("planted parser bug")
  monkeypatch.setattr(math_answer, "_errors", 0)
  monkeypatch.setattr(math_answer, "judge", broken)
  with caplog.at_level("ERROR"):
    for _ in range(6):
      math_answer.score("Answer: 3", "3")
  assert math_answer.verifier_errors() == 6
  logged = [r for r in caplog.records if "parser error" in r.getMessage()]
  assert len(logged) == math_answer._LOGGED_ERRORS == 5  # pylint: disable=protected-access
  assert {r.name for r in logged} == {"dapo_jax.rewards.math_answer"}
  assert logged[0].getMessage() == ("math_answer.score: parser error #1 (response of 9 chars, "
                                    "truth '3') read as -1")


def test_score_responses_decodes_each_row_to_its_length():
  # Token t decodes to chr(t); row (n, g) is cut at lengths[n, g] and verified against answers[n].
  tokens = np.zeros((2, 2, 12), np.int32)
  texts = [["Answer: 7", "Answer: 8"], ["Answer: 5", "x"]]
  for n in range(2):
    for g in range(2):
      tokens[n, g, :len(texts[n][g])] = [ord(c) for c in texts[n][g]]
  tokens[0, 1, 9] = ord("9")  # past the length: "Answer: 89" would be wrong
  lengths = np.array([[9, 9], [9, 1]], np.int32)
  decoded = []
  def decode(rows):
    decoded.append(rows)
    return ["".join(map(chr, r)) for r in rows]
  score, correct, preds = rewards.score_responses(tokens, lengths, ["7", "5"], decode=decode,
                                                  reward_fn=math_answer.score)
  assert len(decoded) == 1 and len(decoded[0]) == 4
  assert score.dtype == np.float32 and correct.dtype == np.bool_
  np.testing.assert_array_equal(score, [[1.0, -1.0], [1.0, -1.0]])
  np.testing.assert_array_equal(correct, [[True, False], [True, False]])
  assert preds == [["7", "8"], ["5", None]]


def test_braced_end_scans_at_most_limit_characters_inside():
  # limit counts the characters between the braces: 3 fit, 4 do not.
  assert answer_forms.braced_end("{abc}", 0, limit=3) == 4
  assert answer_forms.braced_end("{abcd}", 0, limit=3) is None
  assert answer_forms.braced_end("x{a{b}c}", 1) == 7


def test_normalize_string_drops_latex_spacing_inside():
  assert answer_forms.normalize_string("x\\!+\\,1\\;-\\ y~z") == "x+1-yz"


def test_text_type_error_names_the_type():
  with pytest.raises(TypeError, match="^math_answer.score: text must be str, got int$"):
    math_answer.score(5, "3")


def test_boundaries_of_peeling_and_length():
  # An empty delimiter pair peels to nothing (so it never equals an empty-math truth); an
  # escaped period or thin space is not a trailing period or comma; MAX_ANSWER_CHARS is inclusive.
  assert answer_forms.normalize_string("\\(\\)") == ""
  assert answer_forms.normalize_string("\\[\\]") == ""
  assert answer_forms.normalize_string("x\\,") == "x"
  assert answer_forms.normalize_string("x\\.") == "x\\."
  n = answer_forms.MAX_ANSWER_CHARS
  assert answer_forms.as_number(" " * (n - 2) + "42") == "42"
  assert answer_forms.as_number(" " * (n - 1) + "42") is None
