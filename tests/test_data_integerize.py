"""data/integerize + data/latex_value: hand-computed rewrites, refusals, verification, the CLI."""
import dataclasses

import pytest
import sympy

from dapo_jax.data import integerize, latex_value, readers, template
from dapo_jax.data.example import Example
from dapo_jax.rewards import math_answer


@pytest.mark.parametrize("text,want", [
    (r"\frac{14}{3}", sympy.Rational(14, 3)), (r"\frac43", sympy.Rational(4, 3)),
    (r"\dfrac{17}{50}", sympy.Rational(17, 50)), (r"1\frac{4}{5}", sympy.Rational(9, 5)),
    (r".0000672", sympy.Rational(672, 10**7)), (r"3\sqrt{13}", 3 * sympy.sqrt(13)),
    (r"\frac{3\sqrt{3}}{4}", 3 * sympy.sqrt(3) / 4), (r"6 - 5i", 6 - 5 * sympy.I),
    (r"-\frac{\pi}{6}", -sympy.pi / 6), (r"\sqrt2", sympy.sqrt(2)), ("$4.5$", sympy.Rational(9, 2)),
])
def test_latex_value(text, want):
  assert sympy.simplify(latex_value.value(text) - want) == 0


@pytest.mark.parametrize("text", ["x+1", r"\infty", r"\text{east}", r"\frac{1}", "", "1/0", "I"])
def test_latex_value_refuses(text):
  with pytest.raises(latex_value.LatexError):
    latex_value.value(text)


@pytest.mark.parametrize("answer,problem,kind,target", [
    (r"\frac{14}{3}", "", "fraction", 17), (r"-\frac{35}{9}", "", "fraction", -26),
    ("0.15", "", "fraction", 23), (r"137 \frac{1}{2}", "", "fraction", 277),
    (r"\sqrt{51}", "", "radical", 52), (r"11 \sqrt{5} + 11", "", "radical", 27),
    (r"\frac{3\sqrt{3}}{4}", "", "radical", 10), (r"\frac{\sqrt{3}}{3}", "", "radical", 7),
    (r"\sqrt{8}", "", "radical", 4),  # 2√2: the canonical n is square-free
    (r"288 \pi", "", "pi", 288), (r"18+2\pi", "", "pi", 20), (r"-\frac{\pi}{6}", "", "pi", 5),
    ("1 - 12i", "", "complex", -11), (r"3 \pm 2 \sqrt{2}", "", "plus_minus", 7),
    (r"90^\circ", "", "unit", 90), (r"864 \mbox{ inches}^2", "", "unit", 864),
    ("x=5", "", "unit", 5), (r"\frac{270}7\text{ degrees}", "", "fraction", 277),
    ("(6,31,-1)", "Enter the ordered triple.", "tuple", 36),
    ("(3,4]", "Find the values.", "interval", 7),
    (r"(-\sqrt{3}, \sqrt{3})", "Give the interval.", "interval", 0),
    (r"x \in [-2,7]", "", "interval", 5), ("3, 5, 7", "", "list", 15),
    (r"\begin{pmatrix} -1/3 \\ 2/3 \\ 5/3 \end{pmatrix}", "", "matrix", 2),
])
def test_rewrite(answer, problem, kind, target):
  rw = integerize.rewrite(answer, problem)
  assert (rw.kind, rw.target) == (kind, target)
  integerize.verify(answer, rw)


@pytest.mark.parametrize("answer,reason", [
    ("52_8", "base-n numeral"), (r"\text{(C)}", "text or set answer"),
    ("p - q", "symbolic or text"), (r"(0,9) \cup (9,36)", "union of intervals"),
    (r"\left( \frac{3}{2}, -13 \right)", "non-integer sum"),
    ("(5,\\infty)", "symbolic or unbounded entry"),
    (r"\frac{20000}{\pi}", "unsupported form"), (r"\sqrt{2}+\sqrt{3}", "unsupported form"),
    ("1.5+2i", "complex with non-integer parts"), ("17", "already an integer"),
])
def test_rewrite_refuses(answer, reason):
  with pytest.raises(integerize.Refused) as err:
    integerize.rewrite(answer, "")
  assert err.value.reason == reason


@pytest.mark.parametrize("params", [
    (("m", 28), ("n", 6)),  # not in lowest terms
    (("m", 14), ("n", 4)),  # right value, wrong form: 14/4 = 7/2 but not lowest terms
    (("m", 15), ("n", 3)),  # wrong value
])
def test_verify_catches_bad_fraction(params):
  rw = integerize.Rewrite("fraction", sum(v for _, v in params), params)
  with pytest.raises(integerize.Refused, match="unverified"):
    integerize.verify(r"\frac{7}{2}", rw)


def test_verify_catches_wrong_target_and_radical():
  good = integerize.rewrite(r"2\sqrt{8}")  # 4√2 -> 6
  assert good.target == 6
  for bad in (dataclasses.replace(good, target=7),
              integerize.Rewrite("radical", 10, (("m", 2), ("n", 8)))):  # 8 not square-free
    with pytest.raises(integerize.Refused, match="unverified"):
      integerize.verify(r"2\sqrt{8}", bad)
  with pytest.raises(integerize.Refused, match="unverified"):
    integerize.verify("(1,2)", integerize.Rewrite("tuple", 4, ("1", "2")))


def _example(answer, problem="What is it?"):
  return Example(id="t1", problem=problem, prompt=template.make_prompt(problem), answer=answer,
                 answer_is_int=False, source="math_500")


def test_convert_rewrites_prompt_and_verifier_scores_target():
  new, kind = integerize.convert(_example(r"\frac{3}{56}"))
  assert kind == "fraction" and new.answer == "59" and new.answer_is_int
  assert new.problem.startswith("What is it?\n\n") and "$m + n$" in new.problem
  assert new.prompt == template.make_prompt(new.problem) and new.source == "math_500_int"
  assert math_answer.score("so\nAnswer: 59", new.answer)[1]
  assert not math_answer.score("so\nAnswer: 3/56", new.answer)[1]


def test_fallback_hook_used_only_on_refusals():
  calls = []

  def hook(problem, answer):
    calls.append(answer)
    return (problem + " Give 4.", 4)

  out, counts = integerize.convert_all(
      [_example(r"\text{east}"), _example(r"\frac12"),
       dataclasses.replace(_example("3"), answer_is_int=True)], fallback=hook)
  assert calls == [r"\text{east}"]
  assert [e.answer for e in out] == ["4", "3"]
  assert counts == {"converted: llm": 1, "converted: fraction": 1}
  with pytest.raises(ValueError, match="fallback: target"):
    integerize.convert(_example(r"\text{x}"), fallback=lambda p, a: (p, "4"))


@pytest.fixture(scope="module")
def math500():
  source, _ = readers.load_examples("math_500")
  return (source, *integerize.convert_all(source))


def test_math500_counts_and_every_conversion_verifies(math500):
  source, converted, counts = math500
  assert sum(counts.values()) == 184
  assert len(converted) >= 80 and len(converted) == sum(
      v for k, v in counts.items() if k.startswith("converted"))
  by_id = {e.id: e for e in source}
  for ex in converted:
    rw = integerize.rewrite(by_id[ex.id].answer, by_id[ex.id].problem)
    integerize.verify(by_id[ex.id].answer, rw)
    assert ex.answer == str(rw.target)


def test_cli_report(capsys, tmp_path):
  out = tmp_path / "int.jsonl"
  assert integerize.main(["--report", "--out", str(out)]) == 0
  last = capsys.readouterr().out.strip().splitlines()[-1]
  n = int(last.split()[1])
  assert last == f"converted {n} of 184" and n >= 80
  examples, _ = readers.read_file(out, integer_answers=True)
  assert len(examples) == n
  with pytest.raises(SystemExit):
    integerize.main([])


def test_eval_name_math_500_int_loads_the_converted_set(math500):
  from configs import tiny_cpu  # pylint: disable=g-import-not-at-top
  from dapo_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import setup  # pylint: disable=g-import-not-at-top
  c = tiny_cpu.get_config()
  c.task.eval_name = "math_500_int"
  c.eval.num_problems = 0
  task = setup.load_task(config_lib.parse(c))
  assert len(task.eval) >= 80 and all(e.answer_is_int for e in task.eval)
  assert task.eval == math500[1]
