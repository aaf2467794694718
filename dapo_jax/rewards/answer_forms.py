"""The answer grammar: decorations peeled off an answer string, then exactly one number.

Pure string functions, no exception handling: a crash here is a bug and surfaces in the tests and
the fuzzer (experiments/fuzz_verifier.py). The accepted forms are tabulated in math_answer's
docstring; every function is linear in its input, which callers cap at MAX_ANSWER_CHARS.
"""
import functools
import re
import unicodedata

MAX_ANSWER_CHARS = 10_000  # characters; a longer answer is not an answer (reads as wrong)
MAX_LAYERS = 32  # decorations peeled at most; deeper nesting reads as wrong, in bounded time

# A single number: sign, integer part (thousands groups of exactly three digits, separated by
# ",", "{,}", ",\!" or "\,"), optional fraction. "4 2", "4\,2", "4,2" do not match.
_SEP = r"(?:\{,\}|,\\!\s*|\\,|,)"  # longest first, so that re.sub drops all of ",\!"
_NUMBER_RE = re.compile(r"([+-]?)\s*(\d{1,3}(?:" + _SEP + r"\d{3})+|\d+|)(?:\.(\d+))?")
_SEP_RE = re.compile(_SEP)
_BRACE_RE = re.compile(r"[{}]")
# One variable, then one "=": "x =", "AB=", "x_1 =", "x_{12} =", "\theta =".
_PREFIX_RE = re.compile(r"(?:[A-Za-z]+(?:_\{?[A-Za-z0-9]+\}?|_?[0-9])?|\\[A-Za-z]+)\s*=")
# Unit words the reference strips (verl math_dapo REMOVED_EXPRESSIONS), bare or in \text{}.
_UNIT = (r"(?:(?:square|cubic)\s+)?(?:units?|ways|integers|dollars|cents|mph|inches|hours|"
         r"minutes|seconds|days|feet|meters|cm|km|gm|pounds|points|digits|degrees|students|"
         r"edges|meals|multiples)")
_UNIT_RE = re.compile(r"(?:\\(?:text|mbox|mathrm)\{\s*" + _UNIT + r"\s*\}|(?<![A-Za-z])" + _UNIT
                      + r")$")
_UNIT_TAIL = 80  # characters searched for a unit suffix (longest form ~40): keeps peel linear
_DEGREE_SUFFIXES = ("^\\circ", "^{\\circ}", "\\degree", "°")
_WRAPPERS = ("\\boxed{", "\\fbox{", "\\text{", "\\textbf{", "\\mathbf{", "\\mathrm{", "\\mbox{")
_DELIMITERS = (("\\(", "\\)"), ("\\[", "\\]"))
_NON_ASCII_DIGIT_RE = re.compile(r"(?![0-9])\d")  # str patterns: \d is any Unicode Nd digit
_MINUS_SIGNS = str.maketrans({"\u2212": "-", "\u2013": "-", "\uff0b": "+", "\uff0d": "-"})


@functools.lru_cache(maxsize=None)  # only category-Nd characters reach it: ~700 at most
def _ascii_digit(ch: str) -> str:
  return str(unicodedata.decimal(ch))


def ascii_digits(s: str) -> str:
  """s with Unicode decimal digits (Arabic-Indic, fullwidth, ...) and minus signs as ASCII.

  Only category Nd (what re's \\d matches): superscripts ("²") and other numeric symbols are not
  digits, so "4²" stays "4²".
  """
  if s.isascii():
    return s
  s = _NON_ASCII_DIGIT_RE.sub(lambda m: _ascii_digit(m.group()), s)
  return s.translate(_MINUS_SIGNS)


def braced_end(s: str, open_idx: int, limit: int = MAX_ANSWER_CHARS) -> int | None:
  """Index of the '}' closing the '{' at open_idx, scanning at most `limit` characters."""
  depth = 0
  for m in _BRACE_RE.finditer(s, open_idx, open_idx + limit + 2):
    depth += 1 if m.group() == "{" else -1
    if depth == 0:
      return m.start()
  return None


def well_nested(s: str) -> bool:
  """Every '}' closes an earlier '{' and every '{' is closed."""
  depth = 0
  for m in _BRACE_RE.finditer(s):
    depth += 1 if m.group() == "{" else -1
    if depth < 0:
      return False
  return depth == 0


def _unwrap_command(s: str) -> str:
  """Inner text of `\\boxed{...}` (and the other wrappers) around all of s.

  Not checked for a matching brace, on purpose (it would cost a scan per layer): peeling only
  removes a '{' at the start with a '}' at the end, so a wrong pairing ("\\boxed{4}{2}" -> "4}{2")
  always leaves a string that is not well nested, which is never a number and never equal to a
  well-nested truth (normalize_string rejects it).
  """
  for w in _WRAPPERS:
    if s.startswith(w) and s.endswith("}"):
      return s[len(w):-1]
  return s


def _strip_suffix(s: str) -> str:
  """Drops one trailing period or comma, degree sign or unit word."""
  if s.endswith((".", ",")) and not s.endswith(("\\.", "\\,")):
    return s[:-1]
  for suffix in _DEGREE_SUFFIXES:
    if s.endswith(suffix):
      return s[:-len(suffix)]
  tail = s[-_UNIT_TAIL:]
  m = _UNIT_RE.search(tail)
  if m is None or (m.start() == 0 and len(s) > _UNIT_TAIL):  # cut mid-word: not a unit
    return s
  return s[:len(s) - len(tail) + m.start()]


def _peel_once(s: str, parens: bool) -> str:
  s = s.strip().strip("$*`").strip().removeprefix("\\$")
  for left, right in _DELIMITERS + ((("(", ")"),) if parens else ()):
    if s.startswith(left) and s.endswith(right) and len(s) >= len(left) + len(right):
      s = s[len(left):len(s) - len(right)]
  # Suffixes first: "\\boxed{4} \\text{ ways}" ends in '}' that is not the box's.
  return _unwrap_command(_strip_suffix(s.strip()).strip())


def peel(s: str, *, parens: bool) -> str | None:
  """s without its decorations (see math_answer's table), or None if nested past MAX_LAYERS.

  parens=True also peels "(...)": right for a number, wrong for an interval "(2, 4)".
  """
  for _ in range(MAX_LAYERS):
    inner = _peel_once(s, parens)
    if inner == s:
      return s
    s = inner
  return None


def _canonical(m: re.Match) -> str:
  sign, whole, frac = m.group(1), _SEP_RE.sub("", m.group(2)), (m.group(3) or "").rstrip("0")
  whole = whole.lstrip("0") or "0"
  value = whole + ("." + frac if frac else "")
  return "-" + value if sign == "-" and value != "0" else value


def _single_number(s: str) -> str | None:
  m = _NUMBER_RE.fullmatch(s)
  if m is None or not (m.group(2) or m.group(3)):
    return None
  return _canonical(m)


def as_number(s: str) -> str | None:
  """Canonical decimal string ('-12', '0.5') if s is exactly one number after decorations.

  Kept as a string, so huge numbers compare exactly; '42.0' -> '42', '016' -> '16'.
  """
  if len(s) > MAX_ANSWER_CHARS or "\x00" in s:
    return None
  s = peel(ascii_digits(s), parens=True)
  if s is None:
    return None
  if s.count("=") == 1:  # "x = 42": one variable, one value
    m = _PREFIX_RE.match(s)
    if m is None:
      return None
    s = peel(s[m.end():], parens=True)
    if s is None:
      return None
  return _single_number(s)


def normalize_string(s: str) -> str | None:
  """Comparison key of a non-numeric answer: decorations, spacing and case removed."""
  if len(s) > MAX_ANSWER_CHARS or "\x00" in s or not well_nested(s):
    return None
  s = peel(ascii_digits(s), parens=False)
  if s is None:
    return None
  for spacing in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", "~"):
    s = s.replace(spacing, "")
  s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
  return re.sub(r"\s+", "", s).lower()
