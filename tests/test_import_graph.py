"""The package's import graph has no cycle (module-level, in-function and `if TYPE_CHECKING:`
imports alike, since a type-only cycle binds two modules as tightly for a reader): each module
can be read, tested and moved without the ones that import it."""
import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "dapo_jax"


def _module_name(path: pathlib.Path, root: pathlib.Path) -> str:
  parts = path.relative_to(root.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: pathlib.Path = PACKAGE) -> dict[str, set[str]]:
  """Module -> the dapo_jax modules it imports (`from dapo_jax.x import y` counts as
  dapo_jax.x.y when that is a module, else dapo_jax.x)."""
  files = {_module_name(p, root): p for p in root.rglob("*.py")}
  graph = {}
  for name, path in files.items():
    deps = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
      if isinstance(node, ast.Import):
        targets = [a.name for a in node.names]
      elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
        targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in files
                   else node.module for a in node.names]
      else:
        continue
      deps.update(t for t in targets if t in files and t != name)
    graph[name] = deps
  return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  """One cycle as [a, b, ..., a], or None (iterative depth-first search)."""
  state = {}
  for start in sorted(graph):
    if start in state:
      continue
    stack = [(start, iter(sorted(graph[start])))]
    state[start] = "open"
    while stack:
      node, children = stack[-1]
      child = next(children, None)
      if child is None:
        state[node] = "done"
        stack.pop()
      elif state.get(child) == "open":
        path = [n for n, _ in stack]
        return path[path.index(child):] + [child]
      elif child not in state:
        state[child] = "open"
        stack.append((child, iter(sorted(graph[child]))))
  return None


def test_find_cycle_sees_a_planted_cycle():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
  assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_graph_reads_both_import_forms(tmp_path):
  pkg = tmp_path / "dapo_jax"
  (pkg / "sub").mkdir(parents=True)
  (pkg / "__init__.py").write_text("")
  (pkg / "sub" / "__init__.py").write_text("")
  (pkg / "sub" / "x.py").write_text("def f():\n  from dapo_jax import y\n")
  (pkg / "y.py").write_text("import dapo_jax.sub.x\n")
  graph = import_graph(pkg)
  assert graph["dapo_jax.sub.x"] == {"dapo_jax.y"} and graph["dapo_jax.y"] == {"dapo_jax.sub.x"}
  assert find_cycle(graph) is not None


def test_dapo_jax_has_no_import_cycle():
  cycle = find_cycle(import_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)
