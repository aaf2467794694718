"""Plain-Python readers (no TensorFlow) for DAPO-Math-17k and the math eval sets.

Formats (shared/data/SOURCES.md): DAPO parquet files, either the hub original (prompt wrapped in
the DAPO template, UUID index, each item repeated 100x) or the de-duplicated SvS copy (bare problem,
integer index); and jsonl eval files (problem, answer, id / unique_id). Every row problem raises a
ValueError naming file and row, or, with skip_bad=True (a run's config.task.skip_bad), is skipped,
logged and counted. Blank lines of a jsonl file are skipped and counted. Rows are de-duplicated
by (problem, answer), keeping the first. A data dir or file may be local or a URL (gs://...):
files are read through dapo_jax.workdir.paths.
"""
import contextlib
import dataclasses
import json
import logging
import os
import pathlib

from dapo_jax.workdir import paths
from dapo_jax.data import template
from dapo_jax.data.example import Example, SkipReport, integer_answer

_REPO = pathlib.Path(__file__).resolve().parents[2]
ASSETS_DIR = pathlib.Path(__file__).resolve().parent / "assets"
_PARQUET_COLUMNS = ("prompt", "reward_model.ground_truth", "extra_info.index")


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  filename: str  # default file name inside a data dir
  split: str  # the one split the source has
  integer_answers: bool  # True: a non-integer answer is a bad row; False: kept and flagged
  vendored: bool  # a copy ships in dapo_jax/data/assets


DATASETS = {
    "dapo_math_17k": DatasetSpec("dapo_math_17k_svs.parquet", "train", True, False),
    "aime_2024": DatasetSpec("aime24_qwen25math.jsonl", "test", True, True),
    "aime_2025": DatasetSpec("aime25_areal.jsonl", "test", True, True),
    "amc_2023": DatasetSpec("amc23_qwen25math.jsonl", "test", True, True),
    "math_500": DatasetSpec("math500_simplerl.jsonl", "test", False, True),
}


class RowError(ValueError):
  """A bad row: carries the row number so skip_bad can count it."""


def shared_data_dir() -> pathlib.Path:
  """$DAPO_SHARED_DATA, else <repo>/../shared/data (where tests and CI find the real files)."""
  env = os.environ.get("DAPO_SHARED_DATA")
  return pathlib.Path(env) if env else _REPO.parent / "shared" / "data"


def default_path(name: str, data_dir=None) -> pathlib.Path:
  """Where `name`'s file is: in data_dir if given, else the vendored copy or the shared data."""
  spec = _spec(name)
  if data_dir is not None:
    return paths.resolve(data_dir) / spec.filename
  return (ASSETS_DIR if spec.vendored else shared_data_dir()) / spec.filename


def load_examples(name: str, *, data_dir=None, path=None, skip_bad: bool = False):
  """Reads dataset `name` -> (list[Example], SkipReport). `path` (a file) beats `data_dir`."""
  spec = _spec(name)
  path = paths.resolve(path) if path is not None else default_path(name, data_dir)
  return read_file(path, integer_answers=spec.integer_answers, source=name, skip_bad=skip_bad)


def load_math_500_easy(*, data_dir=None, max_level: int = 2) -> list[Example]:
  """The `math_500_easy` eval set: MATH-500's integer-answer problems of level <= max_level
  (91 of 500 at levels 1-2), the part a small model might score on with the integer verifier."""
  path = default_path("math_500", data_dir)
  examples, _ = read_file(path, integer_answers=False, source="math_500")
  levels = {}
  for _, where, fields in _jsonl_rows(path, extra=("level",)):
    if fields is None:  # a blank line
      continue
    level = fields["level"] if isinstance(fields, dict) else None
    if isinstance(level, bool) or not isinstance(level, int) or not 1 <= level <= 5:
      raise ValueError(f"{path}: {where}: level must be an int in [1, 5], got {level!r}")
    levels[str(fields["id"])] = level
  return [x for x in examples if x.answer_is_int and levels[x.id] <= max_level]


def read_file(path, *, integer_answers: bool, source: str = "", skip_bad: bool = False):
  """Reads a .parquet or .jsonl file of math problems -> (list[Example], SkipReport)."""
  path = paths.resolve(path)
  if not path.exists() or path.is_dir():
    raise FileNotFoundError(f"{path}: no such data file (set config.task.data_dir, or "
                            f"$DAPO_SHARED_DATA, to the directory holding it)")
  report = SkipReport(file=str(path))
  if path.suffix == ".parquet":
    rows = _parquet_rows(path)
  elif path.suffix == ".jsonl":
    rows = _jsonl_rows(path)
  else:
    raise ValueError(f"{path}: unknown data format (expected .parquet or .jsonl)")
  examples, seen, answers = [], set(), {}
  for row, where, fields in rows:
    if fields is None:  # a blank line: no row
      report.blank += 1
      continue
    report.rows_in += 1
    try:
      ex = _make_example(where, fields, integer_answers=integer_answers, source=source,
                         report=report)
    except RowError as e:
      if not skip_bad:
        raise ValueError(f"{path}: {e} (fix or remove the row; skip_bad=True, in a run "
                         f"config.task.skip_bad=True, skips and counts bad rows)") from None
      logging.warning("skipping %s: %s", path, e)
      report.skipped.append({"row": row, "reason": str(e)})
      continue
    if (ex.problem, ex.answer) in seen:
      report.duplicates += 1
      continue
    seen.add((ex.problem, ex.answer))
    answers.setdefault(ex.problem, set()).add(ex.answer)
    report.non_integer += not ex.answer_is_int
    examples.append(ex)
  report.rows_out = len(examples)
  report.conflicting = sum(len(a) > 1 for a in answers.values())
  return examples, report


def _spec(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise ValueError(f"name: unknown dataset {name!r}; known: {sorted(DATASETS)}")
  return DATASETS[name]


def _parquet_rows(path):
  """Yields (row, "row N", {"prompt", "answer", "id"}) from a DAPO-format parquet (0-based rows)."""
  with contextlib.ExitStack() as stack:  # a URL's file object, closed once the columns are read
    source = stack.enter_context(path.open("rb")) if paths.is_url(path) else os.fspath(path)
    cols, num_rows = _parquet_columns(path, source)
  for row in range(num_rows):
    rm, info = cols["reward_model"][row] or {}, cols["extra_info"][row] or {}
    yield row, f"row {row}", {"prompt": cols["prompt"][row], "answer": rm.get("ground_truth"),
                "id": info.get("index")}


def _parquet_columns(path, source):
  """({column: python list}, rows) of the DAPO columns; ValueError naming `path` if unreadable."""
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  import pyarrow.parquet as pq  # pylint: disable=g-import-not-at-top
  try:
    schema = pq.read_schema(source)
  except (pa.ArrowException, OSError) as e:
    raise ValueError(f"{path}: not a readable parquet file ({e})") from None
  missing = [c for c in _PARQUET_COLUMNS if not _has_column(schema, c)]
  if missing:
    raise ValueError(f"{path}: parquet is missing column(s) {missing}; a DAPO-format file has "
                     f"{list(_PARQUET_COLUMNS)}")
  try:
    table = pq.read_table(source, columns=["prompt", "reward_model", "extra_info"])
    cols = {c: table.column(c).to_pylist() for c in ("prompt", "reward_model", "extra_info")}
  except (pa.ArrowException, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: cannot decode parquet columns ({e})") from None
  return cols, table.num_rows


def _has_column(schema, dotted: str) -> bool:
  import pyarrow as pa  # pylint: disable=g-import-not-at-top
  head, _, child = dotted.partition(".")
  if head not in schema.names:
    return False
  typ = schema.field(head).type
  return not child or (pa.types.is_struct(typ) and typ.get_field_index(child) >= 0)


def _jsonl_rows(path, extra=()):
  """Yields (line number, "line N", {"prompt", "answer", "id", *extra}) from a jsonl file
  (1-based); None in place of the fields for a blank line."""
  with paths.resolve(path).open("rb") as f:
    for lineno, raw in enumerate(f, start=1):
      where = f"line {lineno}"
      if not raw.strip():
        yield lineno, where, None
        continue
      try:
        text = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        yield lineno, where, RowError(f"{where}: not valid UTF-8 at byte {e.start}")
        continue
      try:
        obj = json.loads(text)
      except json.JSONDecodeError as e:
        yield lineno, where, RowError(f"{where}: malformed JSON ({e.msg} at column {e.colno})")
        continue
      if not isinstance(obj, dict):
        yield lineno, where, RowError(f"{where}: expected a JSON object, got "
                                      f"{type(obj).__name__}")
        continue
      rid = obj.get("id", obj.get("unique_id", lineno))
      yield lineno, where, {"prompt": obj.get("problem"), "answer": obj.get("answer"), "id": rid,
                            **{k: obj.get(k) for k in extra}}


def _make_example(where, fields, *, integer_answers, source, report) -> Example:
  """Validates one row into an Example; raises RowError naming the row (`where`)."""
  if isinstance(fields, RowError):
    raise fields
  problem = _problem_text(fields["prompt"], where)
  unwrapped = template.split_prompt(problem)
  if unwrapped is not None:
    report.templated += 1
    problem = unwrapped
  if problem != problem.strip():
    report.stripped += 1
    problem = problem.strip()
  if not problem:
    raise RowError(f"{where}: empty problem")
  answer = fields["answer"]
  if answer is None or (isinstance(answer, (str, bytes)) and not answer.strip()):
    raise RowError(f"{where}: missing answer")
  if isinstance(answer, bytes):
    answer = _decode(answer, f"{where}: answer")
  canon = integer_answer(answer)
  if canon is None and integer_answers:
    raise RowError(f"{where}: non-integer answer {answer!r} where integers are required")
  if canon is None and not isinstance(answer, str):
    raise RowError(f"{where}: answer of type {type(answer).__name__} is neither text nor number")
  if fields["id"] is None:
    raise RowError(f"{where}: missing id (extra_info.index)")
  return Example(id=str(fields["id"]), problem=problem, prompt=template.make_prompt(problem),
                 answer=canon if canon is not None else answer.strip(),
                 answer_is_int=canon is not None, source=source)


def _problem_text(prompt, where: str) -> str:
  """The user message text of a chat-format prompt (list of {role, content}) or a plain string."""
  if isinstance(prompt, list):
    users = [m for m in prompt
             if isinstance(m, dict) and m.get("role", "user") in ("user", b"user")]
    if not users:
      raise RowError(f"{where}: prompt holds no user message")
    prompt = users[-1].get("content")
  if prompt is None:
    raise RowError(f"{where}: empty problem (no prompt text)")
  if isinstance(prompt, bytes):
    prompt = _decode(prompt, f"{where}: problem")
  if not isinstance(prompt, str):
    raise RowError(f"{where}: problem of type {type(prompt).__name__} is not text")
  return prompt


def _decode(raw: bytes, what: str) -> str:
  try:
    return raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise RowError(f"{what} is not valid UTF-8 at byte {e.start}") from None
