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
import sys

from dapo_jax.data import readers, template
from dapo_jax.data.example import Example
from dapo_jax.data.integer_forms import (  # noqa: F401  (re-exported: the rewriting)
    FORMS, Refused, Rewrite, rewrite, verify)

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
