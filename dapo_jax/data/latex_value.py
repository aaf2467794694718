"""Exact values of simple LaTeX answers (MATH style) as sympy expressions, for data/integerize.

Accepts numbers (integers, decimals `1.25`, `.35`), `\\frac{a}{b}` / `\\dfrac` / `\\frac43`,
`\\sqrt{n}` / `\\sqrt2`, `\\pi`, the imaginary unit `i`, `+ - * /`, parentheses and implicit
products (`3\\sqrt{13}`, `288 \\pi`); a mixed number `1\\frac{4}{5}` is 1 + 4/5 as MATH writes it.
Anything else (a variable, `\\infty`, `\\text{...}`) raises LatexError: integerize then refuses
the rewrite rather than guessing.
"""
import fractions
import re

import sympy
from sympy.parsing import sympy_parser


class LatexError(ValueError):
  """The text is not a value this module can evaluate exactly."""


# Spacing and sizing commands that carry no value.
_NOISE = (r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\displaystyle")
_MIXED = re.compile(r"^(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_DECIMAL = re.compile(r"\d*\.\d+|\d+\.\d*")
_ALLOWED = re.compile(r"^[0-9+\-*/() ]*$")
_TRANSFORMS = sympy_parser.standard_transformations + (
    sympy_parser.implicit_multiplication,)


def normalize(text: str) -> str:
  """`text` without noise commands and whitespace, `\\dfrac`/`\\tfrac` read as `\\frac`."""
  s = text
  for noise in _NOISE:
    s = s.replace(noise, "")
  s = re.sub(r"(?<!\\)\$", "", s)  # math-mode delimiters; an escaped \$ is currency
  s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
  return re.sub(r"\s+", "", s)


def value(text: str) -> sympy.Expr:
  """The exact sympy value of a LaTeX answer; LatexError when it is not a plain number."""
  s = normalize(text)
  if not s:
    raise LatexError("empty answer")
  mixed = _MIXED.match(s)
  if mixed:
    sign, whole, num, den = mixed.groups()
    frac = sympy.Integer(whole) + sympy.Rational(int(num), int(den))
    return -frac if sign else frac
  expr = _to_python(s)
  tokens = re.sub(r"sqrt|pi|I", " ", expr)
  if not _ALLOWED.match(tokens):
    raise LatexError(f"not a plain number: {text!r}")
  try:
    out = sympy_parser.parse_expr(
        expr, local_dict={"sqrt": sympy.sqrt, "pi": sympy.pi, "I": sympy.I},
        transformations=_TRANSFORMS, evaluate=True)
  except (SyntaxError, TypeError, ValueError, ZeroDivisionError) as err:
    raise LatexError(f"cannot evaluate {text!r}: {err}") from None
  if not isinstance(out, sympy.Expr) or out.free_symbols or out.has(sympy.zoo, sympy.nan):
    raise LatexError(f"not a finite number: {text!r}")
  return sympy.nsimplify(out) if out.has(sympy.Float) else out


def _to_python(s: str) -> str:
  """Rewrites normalized LaTeX into a python expression string (`\\frac{a}{b}` -> `((a)/(b))`)."""
  out, pos = [], 0
  while pos < len(s):
    if s.startswith(r"\frac", pos):
      num, pos = _argument(s, pos + 5)
      den, pos = _argument(s, pos)
      out.append(f" (({_to_python(num)})/({_to_python(den)})) ")
    elif s.startswith(r"\sqrt", pos):
      arg, pos = _argument(s, pos + 5)
      out.append(f" sqrt({_to_python(arg)}) ")
    elif s.startswith(r"\pi", pos):
      out.append(" pi ")
      pos += 3
    elif s.startswith(r"\cdot", pos) or s.startswith(r"\times", pos):
      out.append("*")
      pos += 5 if s.startswith(r"\cdot", pos) else 6
    elif s[pos] in "{}":
      out.append("(" if s[pos] == "{" else ")")
      pos += 1
    elif s[pos] == "i" and not s[pos + 1:pos + 2].isalpha():
      out.append(" I ")
      pos += 1
    else:
      decimal = _DECIMAL.match(s, pos)
      if decimal:
        frac = fractions.Fraction(decimal.group())
        out.append(f" ({frac.numerator}/{frac.denominator}) ")
        pos = decimal.end()
      elif s[pos].isalpha() or s[pos] == "\\":
        raise LatexError(f"not a plain number (at {s[pos:pos + 8]!r}): {s!r}")
      else:
        out.append(s[pos])
        pos += 1
  return "".join(out)


def _argument(s: str, pos: int) -> tuple[str, int]:
  """The LaTeX argument at s[pos]: a braced group or a single character -> (text, next pos)."""
  if pos >= len(s):
    raise LatexError(f"missing argument at the end of {s!r}")
  if s[pos] != "{":
    return s[pos], pos + 1
  depth = 0
  for end in range(pos, len(s)):
    depth += {"{": 1, "}": -1}.get(s[end], 0)
    if depth == 0:
      return s[pos + 1:end], end + 1
  raise LatexError(f"unbalanced braces in {s!r}")


def split_top(s: str, sep: str = ",") -> list[str]:
  """Splits normalized `s` at `sep` outside any (), [], {} nesting."""
  parts, depth, start = [], 0, 0
  for pos, ch in enumerate(s):
    depth += 1 if ch in "([{" else -1 if ch in ")]}" else 0
    if ch == sep and depth == 0:
      parts.append(s[start:pos])
      start = pos + 1
  parts.append(s[start:])
  return parts
