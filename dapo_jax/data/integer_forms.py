"""Answer rewriting for the integer-answer transformation (data/integerize.py): a LaTeX answer
-> the verified integer of its canonical form, or `Refused` with the reason.

Each rewrite is checked with sympy (`verify`): the form with the found integers put in must
equal the original answer exactly, the integers must meet the form's canonical conditions, and
the target must be their sum (aggregates: the sum of the original entries).
"""
import dataclasses
import math
import re

import sympy

from dapo_jax.data.latex_value import LatexError, normalize, split_top, value

_GIVE = "Instead of the answer itself, give the value of ${}$ as an integer."
# form -> (display with letters, conditions on the letters, the sum asked for).
FORMS = {
    "fraction": (r"\frac{m}{n}", "$m$ and $n$ are relatively prime integers and $n > 0$", "m + n"),
    "radical": (r"k + m\sqrt{n} \over p", "", "k + m + n + p"),
    "pi": (r"k + m\pi \over p", "", "k + m + p"),
    "complex": ("a + bi", "$a$ and $b$ are real numbers", "a + b"),
    "plus_minus": (r"k \pm m\sqrt{n}", "$k$, $m > 0$, $n$ are integers and $n$ is not divisible "
                   "by the square of any prime", "k + m + n"),
}
_AGGREGATE = {
    "tuple": "Give the sum of the coordinates of your answer as an integer.",
    "matrix": "Give the sum of all the entries of your answer as an integer.",
    "interval": "The answer is an interval with endpoints $a < b$. Instead of the interval, give "
                "the value of $a + b$ as an integer.",
    "list": "Give the sum of all the values that answer the question, as an integer.",
}
_UNIT = re.compile(r"(\^\{?\\circ\}?|\\(?:text|mbox)\{\s*(?:degrees|cents|inches|cm|units)\s*\}"
                   r"(?:\^2)?)$")
_CURRENCY = re.compile(r"^\\?\$")
_EQUATION = re.compile(r"^[a-z](?:=|\\in)")
_BASE = re.compile(r"_\{?\d+\}?$")
_MATRIX = re.compile(r"^\\begin\{pmatrix\}(.*)\\end\{pmatrix\}$")


class Refused(ValueError):
  """No verified rewrite; `reason` is the report's category."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason


@dataclasses.dataclass(frozen=True)
class Rewrite:
  kind: str  # a FORMS or _AGGREGATE key, or "unit" (an integer once a unit / `x =` is dropped)
  target: int
  params: tuple = ()  # FORMS: (letter, int) pairs; aggregates: the entries' LaTeX
  instruction: str = ""


def rewrite(answer: str, problem: str = "") -> Rewrite:
  """The verified integer rewrite of `answer` (LaTeX); raises Refused(reason) when there is none."""
  s = normalize(answer)
  if _BASE.search(s):
    raise Refused("base-n numeral", answer)
  s, stripped = _strip_decoration(s)
  if r"\cup" in s:
    raise Refused("union of intervals", answer)
  if r"\text" in s or r"\mbox" in s or r"\{" in s:
    raise Refused("text or set answer", answer)
  out = _aggregate(s, problem) or _scalar(s, stripped)
  verify(answer, out)
  return out


def _strip_decoration(s: str) -> tuple[str, bool]:
  """Drops a trailing unit, a leading currency sign or `x =` / `x \\in`; True if any was."""
  bare = _CURRENCY.sub("", _EQUATION.sub("", _UNIT.sub("", s)))
  return bare, bare != s


def _aggregate(s: str, problem: str) -> Rewrite | None:
  """Tuple, vector/matrix, interval or list rewrites (the sum of the entries); None if scalar."""
  matrix = _MATRIX.match(s)
  if matrix:
    kind, entries = "matrix", re.split(r"\\\\|&", matrix.group(1))
  elif s[:1] in ("(", "[") and s[-1:] in (")", "]") and len(split_top(s[1:-1])) > 1:
    entries = split_top(s[1:-1])
    # A square bracket only ever closes an interval; "(a, b)" is one when the problem says so.
    interval = "interval" in problem.lower() or s[0] + s[-1] != "()"
    kind = "interval" if interval else "tuple"
    if kind == "interval" and len(entries) != 2:
      raise Refused("interval with other than two endpoints", s)
  elif len(split_top(s)) > 1:
    kind, entries = "list", split_top(s)
  else:
    return None
  total = sum(_entry_value(e, s) for e in entries)
  if not total.is_Integer:
    raise Refused("non-integer sum", f"{s} sums to {total}")
  return Rewrite(kind, int(total), tuple(entries), _AGGREGATE[kind])


def _entry_value(entry: str, whole: str) -> sympy.Expr:
  try:
    return value(entry)
  except LatexError:
    raise Refused("symbolic or unbounded entry", whole) from None


def _scalar(s: str, stripped: bool) -> Rewrite:
  """Fraction / radical / π / complex / ± / bare-integer rewrites of one value."""
  if r"\pm" in s:
    return _plus_minus(s)
  try:
    val = value(s)
  except LatexError:
    raise Refused("symbolic or text", s) from None
  if val.is_Integer:
    if not stripped:
      raise Refused("already an integer", s)
    return Rewrite("unit", int(val), (), "Give the answer as a bare integer, without units.")
  if val.is_Rational:
    return _form("fraction", m=val.p, n=val.q)
  const, terms = sympy.S(val).as_coeff_add()
  if len(terms) != 1 or not const.is_Rational:
    raise Refused("unsupported form", s)
  coeff, atom = terms[0].as_coeff_Mul()
  if atom is sympy.I:
    if not (const.is_Integer and coeff.is_Integer):
      raise Refused("complex with non-integer parts", s)
    return _form("complex", a=int(const), b=int(coeff))
  p = math.lcm(const.q, coeff.q)
  k, m = int(const * p), int(coeff * p)
  if atom is sympy.pi:
    return _form("pi", k=k, m=m, p=p)
  if atom.is_Pow and atom.exp == sympy.S.Half and atom.base.is_Integer:
    return _form("radical", k=k, m=m, n=int(atom.base), p=p)
  raise Refused("unsupported form", s)


def _plus_minus(s: str) -> Rewrite:
  head, _, tail = s.partition(r"\pm")
  try:
    k, rad = value(head or "0"), value(tail)
  except LatexError:
    raise Refused("symbolic or text", s) from None
  coeff, atom = rad.as_coeff_Mul()
  if not (k.is_Integer and coeff.is_Integer and atom.is_Pow and atom.base.is_Integer):
    raise Refused("unsupported form", s)
  return _form("plus_minus", k=int(k), m=abs(int(coeff)), n=int(atom.base))


def _form(kind: str, **params: int) -> Rewrite:
  """A FORMS rewrite; radical/pi drop the letters that are trivially 0 (k) or 1 (p)."""
  display, cond, asked = FORMS[kind]
  if kind in ("radical", "pi"):
    drop = [x for x, triv in (("k", 0), ("p", 1)) if params[x] == triv]
    for x in drop:
      params.pop(x)
    display, asked = _drop_letters(display, asked, drop)
    cond = _conditions(kind, params)
  letters = tuple(sorted(params.items()))
  text = f"The answer can be written in the form ${display}$, where {cond}. " + _GIVE.format(asked)
  return Rewrite(kind, sum(params.values()), letters, text)


def _drop_letters(display: str, asked: str, drop) -> tuple[str, str]:
  if "k" in drop:
    display = display.replace("k + ", "")
  if "p" in drop:
    display = display.replace(r" \over p", "")
  else:
    display = r"\frac{" + display.replace(r" \over p", "") + "}{p}"
  terms = [t for t in asked.split(" + ") if t not in drop]
  return display, " + ".join(terms)


def _conditions(kind: str, params: dict) -> str:
  text = ", ".join(f"${x}$" for x in sorted(params)) + " are integers"
  if "p" in params:
    coprime = ", ".join(f"${x}$" for x in ("k", "m", "p") if x in params)
    text += f", $p > 0$, {coprime} have no common factor greater than 1"
  if kind == "radical":
    text += ", and $n$ is not divisible by the square of any prime"
  return text


def verify(answer: str, rw: Rewrite) -> None:
  """Checks `rw` against `answer` with sympy; raises Refused("unverified", why) on any mismatch."""
  s, _ = _strip_decoration(normalize(answer))
  try:
    if rw.kind in _AGGREGATE:
      ok = (all(e in s for e in rw.params) and len(rw.params) > 1
            and sum(value(e) for e in rw.params) == rw.target)
    elif rw.kind == "unit":
      ok = value(s) == rw.target
    else:
      params = dict(rw.params)
      ok = (_canonical(rw.kind, params) and rw.target == sum(params.values())
            and _same(_rendered(rw.kind, params), _original(rw.kind, s)))
  except (LatexError, ZeroDivisionError) as err:
    raise Refused("unverified", f"{answer}: {err}") from None
  if not ok:
    raise Refused("unverified", f"{answer} -> {rw}")


def _canonical(kind: str, p: dict) -> bool:
  """The form's conditions, so that the asked sum is unique."""
  k, m, n, q = p.get("k", 0), p.get("m", 1), p.get("n", 2), p.get("p", 1)
  squarefree = n > 1 and all(e == 1 for e in sympy.factorint(n).values())
  if kind == "fraction":
    return n > 1 and math.gcd(m, n) == 1
  if kind == "complex":
    return p["b"] != 0
  if kind == "plus_minus":
    return m > 0 and squarefree
  return m != 0 and q > 0 and math.gcd(k, m, q) == 1 and (kind == "pi" or squarefree)


def _rendered(kind: str, p: dict) -> list[str]:
  """The form's LaTeX with the integers put in (one value; two for ±)."""
  k, m, n, q = p.get("k", 0), p.get("m"), p.get("n"), p.get("p", 1)
  if kind == "fraction":
    return [rf"\frac{{{m}}}{{{n}}}"]
  if kind == "complex":
    return [f"{p['a']} + ({p['b']})i"]
  if kind == "plus_minus":
    return [rf"{k} + {m}\sqrt{{{n}}}", rf"{k} - {m}\sqrt{{{n}}}"]
  atom = r"\pi" if kind == "pi" else rf"\sqrt{{{n}}}"
  return [rf"\frac{{{k} + ({m}){atom}}}{{{q}}}"]


def _original(kind: str, s: str) -> list:
  if kind != "plus_minus":
    return [value(s)]
  head, _, tail = s.partition(r"\pm")
  return [value(head or "0") + value(tail), value(head or "0") - value(tail)]


def _same(rendered: list[str], original: list) -> bool:
  got = [value(r) for r in rendered]
  return len(got) == len(original) and all(
      any(sympy.simplify(g - o) == 0 for o in original) for g in got)
