"""The DAPO answer reward (+1 / −1): one number on the last `Answer:` line, equal to the truth.

Where the answer is read: after the last `Answer:` (any case, optional spaces, ASCII or fullwidth
colon), the rest of that line, or the next non-empty line when the rest is empty (the reference's
`Answer\\s*:\\s*([^\\n]+)` does the same). With no `Answer:` in the response, the content of the
last `\\boxed{...}` / `\\fbox{...}` (kept from this module's first version; verl's math_dapo reads
only `Answer:` and has `\\boxed{}` as a separate strict mode). The last MAX_CHARS characters are
searched (the reference reads the last 300, and marks a far-away answer wrong).

When the ground truth is a number, the answer must be exactly one number after these decorations
(table rows, each tested in tests/test_rewards.py under its id; ground truth 42 unless stated):

| id | accepted form | example → read as |
|---|---|---|
| plain | the number alone | `Answer: 42` |
| marker | any case, spaces, fullwidth colon, bold | `answer :42`, `Answer：42`, `**Answer:** 42` |
| next-line | empty rest of line: next non-empty line | `Answer:\\n\\n42` |
| last-wins | the last `Answer:` counts | `Answer: 41\\nAnswer: 42` |
| boxed-fallback | no `Answer:`: last `\\boxed{}` | `so \\boxed{41} ... \\boxed{42}` |
| math | `$…$`, `$$…$$`, `\\(…\\)`, `\\[…\\]` | `$42$` |
| command | `\\boxed \\fbox \\text \\textbf \\mathbf \\mathrm \\mbox` {…} | `\\boxed{42}` |
| emphasis | `**…**`, `*…*`, backticks | `**42**` |
| trailing | one trailing period or comma per layer | `42.`, `$42$.`, `42,` |
| parens | parentheses around a number | `(42)` |
| degrees | `^\\circ`, `^{\\circ}`, `\\degree`, `°` | `42^\\circ` |
| units | a unit word the reference strips | `42 ways`, `42cm`, `42\\text{ cm}` |
| prefix | one variable and one `=` | `x = 42`, `AB=42`, `x_1 = 42` |
| thousands | groups of exactly 3 after `,` `{,}` `,\\!` `\\,` | `42,000` = 42000 (truth 42000) |
| zeros | leading zeros, a zero fraction | `042`, `42.0`, `42.00` |
| sign | `+`, `-`, U+2212 minus | `−3` = -3 (truth -3) |
| unicode-digits | any Unicode decimal digit (category Nd) → ASCII | `٤٢`, `４２` |
| currency | a leading `\\$` | `\\$42` |
| non-number-truth | truth not a number: equal after decorations, spacing, case | `\\frac{1}{2}` |

Read as wrong (−1): two or more numbers (`x = 3 or x = 42`, `41, y = 42`, `41 42`), an equation
between numbers (`3 = 42`), digits split by spaces or thin spaces (`4 2`, `4\\,2`, `4,2`), another
value (`42.5`, `-42`), prose around the number (`the answer is 42`), superscripts (`4²` is not 42),
an answer over MAX_ANSWER_CHARS characters or nested past MAX_LAYERS decorations, and any
response containing a NUL byte (rejected, not dropped: `4\\x002` is not 42).

score() never lets a parser error escape: one is counted (verifier_errors()), logged, and read as
−1. The parser functions themselves (extract_answer, judge, answer_forms.*) have no such guard.
"""
import logging
import re

from dapo_jax.rewards import answer_forms

MAX_CHARS = 100_000  # characters; only the tail of longer responses is read
MAX_ANSWER_CHARS = answer_forms.MAX_ANSWER_CHARS
_LOGGED_ERRORS = 5  # tracebacks logged in full; later errors are only counted

_ANSWER_RE = re.compile(r"answer\s*[:：]", re.IGNORECASE)
_REST_RE = re.compile(r"\s*([^\n]*)")  # rest of the line, or the next non-empty line
_BOX_OPENERS = ("\\boxed{", "\\fbox{")
_errors = 0


def _last_boxed(s: str) -> str | None:
  start = max(s.rfind(b) for b in _BOX_OPENERS)
  if start < 0:
    return None
  open_idx = s.index("{", start)
  end = answer_forms.braced_end(s, open_idx)
  return s[open_idx + 1:end].strip() if end is not None else None


def extract_answer(text: str) -> str | None:
  """The raw final answer string of a response (see the module docstring), or None."""
  s = text[-MAX_CHARS:]
  last = None
  for last in _ANSWER_RE.finditer(s):
    pass
  if last is not None:
    return _REST_RE.match(s, last.end()).group(1).strip() or None
  return _last_boxed(s) or None


def normalize_string(s: str) -> str:
  """The comparison key of a non-numeric answer ('' when it has none)."""
  return answer_forms.normalize_string(s) or ""


def _truth(ground_truth) -> str:
  if isinstance(ground_truth, bool) or not isinstance(ground_truth, (str, int)):
    raise TypeError(f"math_answer.score: ground_truth must be str or int, got "
                    f"{type(ground_truth).__name__}")
  gt = str(ground_truth).strip()
  if not gt or len(gt) > MAX_ANSWER_CHARS:
    raise ValueError(f"math_answer.score: ground_truth must be 1..{MAX_ANSWER_CHARS} "
                     f"characters, got {len(gt)}")
  return gt


def judge(text: str, gt: str) -> tuple[bool, str | None]:
  """(correct, predicted answer string). No exception handling: tests and the fuzzer call it."""
  if "\x00" in text:  # a NUL byte is rejected, never dropped ("4\x002" must not read as 42)
    return False, None
  pred = extract_answer(text)
  if pred is None:
    return False, None
  gt_num = answer_forms.as_number(gt)
  if gt_num is not None:
    return answer_forms.as_number(pred) == gt_num, pred
  key = answer_forms.normalize_string(gt)
  return key is not None and key != "" and answer_forms.normalize_string(pred) == key, pred


def score(text: str, ground_truth) -> tuple[float, bool, str | None]:
  """(reward ±1.0, correct, predicted answer) of a response against its ground truth.

  A wrong type (text not str, ground truth not str/int) or an empty ground truth raises: those are
  the caller's bugs. An exception inside the parser is counted in verifier_errors() and read as −1.
  """
  if not isinstance(text, str):
    raise TypeError(f"math_answer.score: text must be str, got {type(text).__name__}")
  gt = _truth(ground_truth)
  try:
    correct, pred = judge(text, gt)
  except Exception:  # pylint: disable=broad-except  # counted and logged, never silent
    _count_error(text, gt)
    return -1.0, False, None
  return (1.0 if correct else -1.0), correct, pred


def _count_error(text: str, gt: str) -> None:
  global _errors
  _errors += 1
  if _errors <= _LOGGED_ERRORS:
    logging.getLogger(__name__).exception(
        "math_answer.score: parser error #%d (response of %d chars, truth %r) read as -1",
        _errors, len(text), gt[:80])


def verifier_errors() -> int:
  """Parser errors since the process started (each scored −1): log the per-step difference."""
  return _errors
