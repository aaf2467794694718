"""The DAPO integer-answer reward (+1 / −1).

The final answer is the text after the last `Answer:` (case-insensitive) up to the end of its
line, else the content of the last `\\boxed{...}`. Both sides are compared as integers when both
read as integers (`016`, `1,234`, `540.`, `**34**`, `$42$`, `x = 42`, `42.0` all read as
integers), otherwise by normalised string equality. Unlike the reference, which reads only the
last 300 characters and compares raw strings, the whole (capped) response is searched.

Never raises, and does linear work in at most MAX_CHARS characters per call.
"""
import re

MAX_CHARS = 100_000   # characters; only the tail of longer responses is read

_ANSWER_RE = re.compile(r"answer\s*[:：]", re.IGNORECASE)
_INT_RE = re.compile(r"[+-]?\d+")
_GROUPED_INT_RE = re.compile(r"[+-]?\d{1,3}(,\d{3})+")
_WHOLE_FLOAT_RE = re.compile(r"([+-]?\d+)\.0*")
_WRAPPERS = (r"\boxed{", r"\fbox{", r"\text{", r"\textbf{", r"\mathrm{", r"\mathbf{")


def _as_text(text) -> str | None:
  if isinstance(text, str):
    return text
  if isinstance(text, (bytes, bytearray)):
    return bytes(text[-4 * MAX_CHARS:]).decode("utf-8", errors="replace")
  return None


def _braced(s: str, open_idx: int) -> str | None:
  """Content of the balanced {...} whose '{' is at open_idx, or None if unbalanced."""
  depth = 0
  for i in range(open_idx, len(s)):
    c = s[i]
    if c == "{":
      depth += 1
    elif c == "}":
      depth -= 1
      if depth == 0:
        return s[open_idx + 1:i]
  return None


def _last_boxed(s: str) -> str | None:
  start = max(s.rfind(r"\boxed{"), s.rfind(r"\fbox{"))
  if start < 0:
    return None
  return _braced(s, s.index("{", start))


def extract_answer(text) -> str | None:
  """The raw final answer string of a response, or None when it states none."""
  s = _as_text(text)
  if s is None:
    return None
  s = s[-MAX_CHARS:].replace("\x00", "")
  last = None
  for last in _ANSWER_RE.finditer(s):
    pass
  if last is not None:
    end = s.find("\n", last.end())
    ans = s[last.end():end if end >= 0 else len(s)].strip()
    if ans:
      return ans
  boxed = _last_boxed(s)
  if boxed is not None and boxed.strip():
    return boxed.strip()
  return None


def _unwrap(s: str) -> str:
  """Strips markup around an answer: $, **, \\( \\), \\boxed{}, \\text{}, a trailing period."""
  for _ in range(8):  # bounded: each pass removes at least one layer or stops
    before = s
    s = s.strip().strip("$*`").strip()
    for left, right in ((r"\(", r"\)"), (r"\[", r"\]")):
      if s.startswith(left) and s.endswith(right):
        s = s[len(left):len(s) - len(right)]
    for w in _WRAPPERS:
      if s.startswith(w):
        inner = _braced(s, len(w) - 1)
        if inner is not None and len(inner) == len(s) - len(w) - 1:
          s = inner
    s = s.rstrip(".").replace(r"\,", "").replace(r"\!", "").replace(r"\ ", "").replace("~", "")
    if s == before:
      break
  return s.strip()


def as_integer(s) -> str | None:
  """Canonical integer string ('-12', '0') if s reads as an integer, else None.

  Kept as a string so that huge integers compare exactly without int() conversion limits.
  """
  s = _unwrap(str(s))
  candidates = [s]
  if "=" in s:  # "x = 42"
    candidates.append(_unwrap(s.rsplit("=", 1)[1]))
  for c in candidates:
    c = c.replace(" ", "")
    if _GROUPED_INT_RE.fullmatch(c):
      c = c.replace(",", "")
    m = _WHOLE_FLOAT_RE.fullmatch(c)
    if m:
      c = m.group(1)
    if _INT_RE.fullmatch(c):
      sign = "-" if c.startswith("-") else ""
      digits = c.lstrip("+-").lstrip("0") or "0"
      return "-" + digits if sign and digits != "0" else digits
  return None


def normalize_string(s) -> str:
  return re.sub(r"\s+", "", _unwrap(str(s))).lower()


def score(text, ground_truth) -> tuple[float, bool, str | None]:
  """(reward ±1.0, correct, predicted answer) of a response against an answer."""
  try:
    pred = extract_answer(text)
    if pred is None:
      return -1.0, False, None
    gt = _unwrap(str(ground_truth)[-MAX_CHARS:])
    pred_int, gt_int = as_integer(pred), as_integer(gt)
    if pred_int is not None and gt_int is not None:
      correct = pred_int == gt_int
    else:
      correct = bool(gt) and normalize_string(pred) == normalize_string(gt)
    return (1.0 if correct else -1.0), correct, pred
  except Exception:  # pylint: disable=broad-except  # a reward must never crash a rollout
    return -1.0, False, None
