"""Integer-answer transformation of MATH-500 (DAPO §3.1): non-integer answers -> integer targets.

  python -m dapo_jax.data.integerize --report [--out math500_int.jsonl] [--data-dir DIR]

DAPO-Math-17k was built by asking for an integer derived from each answer ("the answer has the
form k - m√n; give k + m + n"). This is the rule-based version for MATH-500's 184 non-integer
answers. Forms (canonical, so the integer is unique): a fraction m/n in lowest terms with n > 0
(decimals and mixed numbers too) -> m + n; k + m√n over p with n square-free, p > 0 and
gcd(k, m, p) = 1 -> k + m + n + p (k = 0 or p = 1 drop their term); k + mπ over p -> k + m + p;
a + bi with integer a, b -> a + b; k ± m√n -> k + m + n; an answer with a unit or `x =` that
is an integer -> the bare integer; ordered tuples, vectors and matrices -> the sum of entries;
a bounded interval (the problem says "interval") -> the sum of its endpoints; a comma list ->
the sum of its values; the last four only when that sum is an integer.

Every rewrite is verified with sympy (`verify`): the form with the found integers put in is
evaluated and must equal the original answer exactly, the integers must meet the form's
canonical conditions, and the target must be their sum (aggregates: the sum of the original
entries). Anything else is refused with a reason. The rewritten problem is the original problem
followed by the instruction; `load_examples()` is the `task.eval_name=math_500_int` eval set,
built on the fly from the vendored MATH-500 file (no second vendored copy to keep in sync).

LLM hook: `convert_all(examples, fallback=f)` calls `f(problem: str, answer: str) -> (new_problem,
target: int) | None` on each refused example. Its rewrites are counted as `llm` and are NOT
sympy-verified (free text cannot be); the command line never sets one.
"""
import argparse
import collections
import dataclasses
import json
import math
import re
import sys

import sympy

from dapo_jax.data import readers, template
from dapo_jax.data.example import Example
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


def convert(ex: Example, fallback=None) -> tuple[Example | None, str]:
  """(the rewritten Example, its kind) or (None, the refusal reason)."""
  try:
    rw = rewrite(ex.answer, ex.problem)
    problem, target, kind = f"{ex.problem}\n\n{rw.instruction}", rw.target, rw.kind
  except Refused as err:
    got = fallback(ex.problem, ex.answer) if fallback is not None else None
    if got is None:
      return None, err.reason
    (problem, target), kind = got, "llm"
    if not isinstance(target, int) or isinstance(target, bool):
      raise ValueError(f"fallback: target for {ex.id} must be an int, got {target!r}")
  return dataclasses.replace(ex, problem=problem, prompt=template.make_prompt(problem),
                             answer=str(target), answer_is_int=True, source="math_500_int"), kind


def convert_all(examples, fallback=None):
  """(converted Examples, Counter of "converted: kind" / "refused: reason") over the non-integer
  examples of `examples`."""
  out, counts = [], collections.Counter()
  for ex in examples:
    if ex.answer_is_int:
      continue
    new, why = convert(ex, fallback)
    counts[f"{'converted' if new else 'refused'}: {why}"] += 1
    if new is not None:
      out.append(new)
  return out, counts


def load_examples(data_dir=None) -> list[Example]:
  """The `math_500_int` eval set: MATH-500's converted non-integer answers."""
  source, _ = readers.load_examples("math_500", data_dir=data_dir)
  return convert_all(source)[0]


def report_lines(counts: collections.Counter) -> list[str]:
  total = sum(counts.values())
  done = sum(v for k, v in counts.items() if k.startswith("converted"))
  lines = [f"{n:4d}  {k}" for k, n in sorted(counts.items(), key=lambda kv: (kv[0][:4], -kv[1]))]
  return lines + [f"converted {done} of {total}"]


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--report", action="store_true", help="print counts by kind and reason")
  parser.add_argument("--out", help="write the converted set as jsonl (problem, answer, id)")
  parser.add_argument("--data-dir", default=None, help="dir holding math500_simplerl.jsonl")
  args = parser.parse_args(argv)
  if not args.report and not args.out:
    parser.error("nothing to do: pass --report and/or --out PATH")
  source, _ = readers.load_examples("math_500", data_dir=args.data_dir)
  converted, counts = convert_all(source)
  if args.out:
    with open(args.out, "w", encoding="utf-8") as f:
      for ex in converted:
        f.write(json.dumps({"problem": ex.problem, "answer": ex.answer, "id": ex.id}) + "\n")
  if args.report:
    print("\n".join(report_lines(counts)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
