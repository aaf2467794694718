"""What README.md and the docs cite exists, so they cannot drift from the code: repo paths, links
and #anchors, dotted names of our code (`batch.MiniBatch`, in the syntax tree of the module that
defines or re-exports it) or config (`algo.eps_high`), and the commands of fenced blocks."""
import ast
import functools
import pathlib
import re
import shlex
import sys

from absl import flags
from ml_collections import config_flags
import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "experiments"))
import launch  # noqa: E402  pylint: disable=wrong-import-position
from configs import base as base_config  # noqa: E402  pylint: disable=wrong-import-position
from dapo_jax import config as config_lib  # noqa: E402  pylint: disable=wrong-import-position

DOCS = ["README.md", "experiments/results/README.md"] + sorted(
    f"docs/{p.name}" for p in ROOT.glob("docs/*.md"))
CODE_DIRS, DIRS = ("dapo_jax", "experiments", "benchmarks", "configs"), (ROOT, ROOT / "dapo_jax")
PATH_RE = re.compile(rf"(?<![\w/.-])((?:{'|'.join(CODE_DIRS)}|docs|tests|notebooks)/[\w./-]*[\w/]"
                     r"|(?:core|rewards|models|rollout|data|train|aot)/\w+\.py)(?![\w*<{])")
NAME_RE = re.compile(r"`([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`"  # backticked, a call
                     r"|(?<![\w/.`])(dapo_jax(?:\.[A-Za-z_]\w*)+)")  # or a full name anywhere
ALLOW = {"configs/nope.py": "reliability.md's example of a missing config file",  # cited, absent
         "experiments/results/gpu/": "where device_check.sh will write; no GPU has run it yet"}


@functools.cache
def _module(mod):
  """dapo_jax.train.trainer -> (its file, or a package's __init__.py; its syntax tree) or None."""
  path = next((p for p in (mod.replace(".", "/") + ".py", mod.replace(".", "/") + "/__init__.py")
               if (ROOT / p).is_file()), None)
  return path and (path, ast.parse((ROOT / path).read_text(encoding="utf-8")))


@functools.cache
def _index():
  """(short module name -> modules, top-level def or class name -> modules, file names)."""
  mods, defs, files = {}, {}, {p.name for p in ROOT.iterdir()}
  for d in CODE_DIRS + ("tests", "notebooks"):
    for p in sorted((ROOT / d).rglob("*")):
      files.add(p.name)
      if p.suffix == ".py" and d in CODE_DIRS:
        mod = ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        mods.setdefault(mod.split(".")[-1], []).append(mod)
        for name in (n for n, hit in _members(_module(mod)[1], _module(mod)[0]).items()
                     if isinstance(hit, (ast.ClassDef, ast.FunctionDef))):
          defs.setdefault(name, []).append(mod)
  return mods, defs, files


@functools.cache
def _members(node, path):
  """Names a module or class body defines -> a node, (module, name) for a re-export, or None."""
  out, lines = {}, (ROOT / path).read_text(encoding="utf-8").splitlines()
  for st in node.body:
    if isinstance(st, (ast.FunctionDef, ast.ClassDef)):
      out[st.name] = st
      if isinstance(node, ast.ClassDef):  # self.x = ... in a method: an instance attribute
        out.update({t.attr: None for n in ast.walk(st) if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Attribute)})
    elif isinstance(st, (ast.Assign, ast.AnnAssign)):
      out.update({n.id: None for n in ast.walk(st)
                  if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
    elif isinstance(st, ast.ImportFrom) and ("F401" in lines[st.lineno - 1] or "__init__" in path):
      out.update({a.asname or a.name: (st.module, a.name) for a in st.names})
  return out


def _resolve(mod, parts, scope=None):
  """Whether mod.parts... names something: a submodule, a def, a class member, a value."""
  if scope is None and parts and _module(f"{mod}.{parts[0]}"):
    return _resolve(f"{mod}.{parts[0]}", parts[1:])
  if not parts or not _module(mod):
    return bool(_module(mod))
  hit = _members(scope or _module(mod)[1], _module(mod)[0]).get(parts[0], KeyError)
  if isinstance(hit, tuple) and parts[1:]:  # a re-export: where it comes from
    return _resolve(hit[0], [hit[1]] + parts[1:])
  return hit is not KeyError and (len(parts) == 1 or isinstance(hit, ast.ClassDef)
                                  and _resolve(mod, parts[1:], hit))


def _broken_name(name):
  """None when `name` resolves or is not ours (jax.jit, config.json), else why it does not."""
  parts, (mods, defs, files) = name.split("."), _index()
  if parts[-1] in ("py", "sh", "ipynb", "json", "jsonl", "txt", "lock", "jinja", "md"):
    return None if name in files or parts[-1] not in ("py", "sh", "ipynb") else f"{name}: no file"
  where = [("dapo_jax", parts[1:])] if parts[0] == "dapo_jax" else [
      (m, parts[1:]) for m in mods.get(parts[0], [])] + [(m, parts) for m in defs.get(parts[0], [])]
  node = base_config.base_config()
  for p in parts[1:] if parts[0] == "config" else parts:  # a config field?
    node = node[p] if hasattr(node, "keys") and p in node.keys() else KeyError
  if node is not KeyError or not where and parts[0] != "config" or any(_resolve(*w) for w in where):
    return None
  there = f" (defined in {', '.join(defs[parts[-1]])})" if parts[-1] in defs else ""
  return f"`{name}`: not in {sorted({m for m, _ in where}) or 'configs/base.py'}{there}"


def _commands(text):
  """(program, argv) of each dapo_jax.main / launch.py command in the fenced blocks."""
  for block in re.findall(r"^```[^\n]*\n(.*?)^```", text, re.S | re.M):
    for line in block.replace("\\\n", " ").splitlines():
      for seg in re.split(r"&&|;|\|", line.split(" #")[0]) if re.search(
          r"dapo_jax\.main|experiments/launch\.py", line) else []:
        words = [w for w in shlex.split(seg) if not re.match(r"^[A-Z_]+=", w)]  # no env vars
        yield from ((p, words[len(p):]) for p in (["python", "-m", "dapo_jax.main"], [
            "python", "experiments/launch.py"]) if words[:len(p)] == p)


def _parse(prog, argv):
  """Raises unless argv parses as launch.py's (its sweep expanded) or main.py's (config.parse)."""
  if prog[-1] == "experiments/launch.py":
    args = launch.parse(argv)
    return launch.expand(args.config, args.sweep, args.workdir)
  fv = flags.FlagValues()
  for call in ast.walk(_module("dapo_jax.main")[1]):  # the flags main.py defines
    kind = getattr(getattr(call, "func", None), "attr", "")
    if kind == "DEFINE_config_file":
      config_flags.DEFINE_config_file(call.args[0].value, flag_values=fv, sys_argv=["m"] + argv)
    elif kind.startswith("DEFINE_"):
      getattr(flags, kind)(call.args[0].value, None, "", flag_values=fv)
  assert fv(["m"] + argv) == ["m"], "positional arguments"
  return config_lib.parse(fv.config, config_flags.get_override_values(fv["config"]))


@pytest.mark.parametrize("doc", DOCS)
def test_what_a_doc_cites_exists_and_its_commands_parse(doc, monkeypatch):
  monkeypatch.chdir(ROOT)  # the commands' paths are the repo's
  text = (ROOT / doc).read_text(encoding="utf-8")
  broken = [f"{p}: no such path" for p in sorted(set(PATH_RE.findall(text)))
            if not p.startswith(tuple(ALLOW)) and not any((d / p).exists() for d in DIRS)]
  broken += filter(None, (_broken_name(a or b) for a, b in sorted(set(NAME_RE.findall(text)))))
  for target in sorted(set(re.findall(r"\]\(([^)\s:]+)\)", text))):  # relative links
    path, _, anchor = target.partition("#")
    full = (ROOT / doc).parent / path if path else ROOT / doc
    heads = re.findall(r"^#+ (.*)$", full.read_text(), re.M) if full.is_file() else []
    if not full.exists() or anchor and anchor not in {  # GitHub's anchors
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in heads}:
      broken.append(f"({target}): no such file, or no heading with that anchor")
  for prog, argv in (cmds := list(_commands(text))):
    try:
      _parse(prog, argv)
    except (Exception, SystemExit) as e:  # pylint: disable=broad-except
      broken.append(f"{' '.join(prog + argv)}\n    does not parse: {type(e).__name__}: {e}")
  assert cmds or doc not in ("README.md", "docs/recipes.md"), f"{doc}: no command found"
  assert not broken, f"{doc} cites what the repo does not have:\n  " + "\n  ".join(broken)
