"""The package stays readable: no function under dapo_jax/ longer than 40 lines (docstring
excluded) and no file longer than 330 lines (docs/design.md, "Conventions"). Split the function
or the module at a seam rather than raising the limits."""
import ast
import os

import pytest

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "dapo_jax")
MAX_FUNCTION_LINES, MAX_FILE_LINES = 40, 330


def _files():
  for root, _, names in os.walk(PACKAGE):
    for name in sorted(names):
      if name.endswith(".py"):
        yield os.path.join(root, name)


def _body_lines(node) -> int:
  body = node.body
  first = body[0]
  if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
      and isinstance(first.value.value, str)):  # the docstring does not count
    if len(body) == 1:
      return 0
    first = body[1]
  return node.end_lineno - first.lineno + 1


@pytest.mark.parametrize("path", list(_files()), ids=lambda p: os.path.relpath(p, PACKAGE))
def test_functions_and_files_fit_on_a_screen(path):
  with open(path, encoding="utf-8") as f:
    src = f.read()
  assert src.count("\n") <= MAX_FILE_LINES, f"{path}: {src.count(chr(10))} lines"
  long = [(n.name, n.lineno, _body_lines(n)) for n in ast.walk(ast.parse(src))
          if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
          and _body_lines(n) > MAX_FUNCTION_LINES]
  assert not long, f"{path}: functions over {MAX_FUNCTION_LINES} lines: {long}"
