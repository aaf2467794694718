"""Tests for dapo_jax.data.readers, example and template on the shared real data and bad inputs."""
import ast
import hashlib
import json
import logging
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dapo_jax.data import readers, template
from dapo_jax.data.example import integer_answer


@pytest.fixture(scope="module")
def shared():
  d = readers.shared_data_dir()
  if not (d / "SOURCES.md").is_file():
    pytest.fail(f"shared data not found at {d}; set DAPO_SHARED_DATA to the data directory")
  return d


def test_template_is_byte_exact_to_sources_md(shared):
  # The reference strings are parsed out of SOURCES.md, not copied into this test.
  text = (shared / "SOURCES.md").read_text()
  ref = {k: ast.literal_eval(v) for k, v in re.findall(r"- (PREFIX|SUFFIX) = (\".*\")$", text,
                                                       flags=re.M)}
  assert ref["PREFIX"].encode() == template.PREFIX.encode()
  assert ref["SUFFIX"].encode() == template.SUFFIX.encode()
  assert template.make_prompt("x") == ref["PREFIX"] + "x" + ref["SUFFIX"]
  assert template.split_prompt(template.make_prompt(" p ")) == " p "
  assert template.split_prompt("no template") is None
  with pytest.raises(ValueError, match="problem"):
    template.make_prompt(None)


def test_dapo_math_17k_counts_and_dedup(shared):
  path = shared / "dapo_math_17k_svs.parquet"
  raw = pq.read_table(path).to_pylist()
  keys = [(r["prompt"][0]["content"].strip(), r["reward_model"]["ground_truth"]) for r in raw]
  examples, rep = readers.load_examples("dapo_math_17k", data_dir=shared)
  assert rep.rows_in == 17917 == len(raw)
  assert rep.rows_out == len(examples) == len(set(keys))
  assert rep.duplicates == 17917 - len(set(keys))
  assert rep.skipped == [] and rep.non_integer == 0 and rep.templated == 0
  assert rep.stripped == 306  # SOURCES.md: 306 rows keep stray leading/trailing whitespace
  assert len({(e.problem, e.answer) for e in examples}) == len(examples)
  assert all(e.answer_is_int and re.fullmatch(r"-?\d+", e.answer) for e in examples)
  assert sum(e.answer.startswith("-") for e in examples) > 0
  assert all(e.prompt == template.PREFIX + e.problem + template.SUFFIX for e in examples)
  assert examples[0].id == "0" and examples[0].answer == "34"


@pytest.mark.parametrize("name,rows,ints", [("aime_2024", 30, 30), ("aime_2025", 30, 30),
                                            ("amc_2023", 40, 40), ("math_500", 500, 316)])
def test_eval_sets(shared, name, rows, ints):
  examples, rep = readers.load_examples(name, data_dir=shared)
  assert rep.rows_in == rows == len(examples) and rep.skipped == []
  assert sum(e.answer_is_int for e in examples) == ints == rows - rep.non_integer
  for e in examples:
    assert e.prompt == template.make_prompt(e.problem) and e.problem and e.source == name
    assert re.fullmatch(r"-?\d+", e.answer) if e.answer_is_int else e.answer
  # The vendored copy (the default location) is the same data.
  vendored, _ = readers.load_examples(name)
  assert vendored == examples


def test_specific_answers(shared):
  aime24 = {e.id: e for e in readers.load_examples("aime_2024", data_dir=shared)[0]}
  assert aime24["67"].answer == "25"  # the file writes "025"
  assert aime24["88"].answer == "127"
  amc = readers.load_examples("amc_2023", data_dir=shared)[0]
  assert amc[0].answer == "27"  # 27.0 in the file
  math500 = {e.id: e for e in readers.load_examples("math_500", data_dir=shared)[0]}
  assert math500["test/precalculus/807.json"].answer == r"\left( 3, \frac{\pi}{2} \right)"
  assert not math500["test/precalculus/807.json"].answer_is_int


def test_vendored_assets_match_checksums(shared):
  sums = dict(reversed(line.split()) for line in
              (readers.ASSETS_DIR / "SHA256SUMS").read_text().splitlines())
  shared_sums = dict(reversed(line.split()) for line in
                     (shared / "SHA256SUMS").read_text().splitlines())
  assert set(sums) == {s.filename for s in readers.DATASETS.values() if s.vendored}
  for name, digest in sums.items():
    assert hashlib.sha256((readers.ASSETS_DIR / name).read_bytes()).hexdigest() == digest
    assert shared_sums[name] == digest
  assert (readers.ASSETS_DIR / "SOURCES.md").is_file()


def test_hub_format_parquet_is_unwrapped_and_deduplicated(tmp_path):
  # The hub original: templated prompt, UUID index, every item repeated (100x there, 4x here).
  problems = [("What is $1+1$?", "2"), ("Find $x$ if $x-3=4$.", "7"), ("Same text", "-5")]
  rows = [{"data_source": "math_dapo",
           "prompt": [{"content": template.make_prompt(p), "role": "user"}],
           "ability": "MATH",
           "reward_model": {"ground_truth": a, "style": "rule-lighteval/MATH_v2"},
           "extra_info": {"index": f"uuid-{i}"}}
          for _ in range(4) for i, (p, a) in enumerate(problems)]
  path = tmp_path / "hub.parquet"
  pq.write_table(pa.Table.from_pylist(rows), path)
  examples, rep = readers.read_file(path, integer_answers=True)
  assert (rep.rows_in, rep.rows_out, rep.duplicates, rep.templated) == (12, 3, 9, 12)
  assert [(e.problem, e.answer, e.id) for e in examples] == [
      (p, a, f"uuid-{i}") for i, (p, a) in enumerate(problems)]
  assert examples[0].prompt == rows[0]["prompt"][0]["content"]


def test_integer_answer():
  cases = {"016": "16", " 42 ": "42", "-7": "-7", "+3": "3", "10,\\!080": "10080",
           "58,500": "58500", "\\$36": "36", "27.0": "27", 27.0: "27", 70: "70", "1.25": None,
           27.5: None, "1,-2": None,
           "3, 5, 7": None, "\\frac{1}{2}": None, True: None, None: None, float("nan"): None,
           "": None, "1,00": None, "12345678901234567890123": "12345678901234567890123"}
  for value, want in cases.items():
    assert integer_answer(value) == want, value


def _write_jsonl(path, lines):
  path.write_bytes(b"\n".join(lines) + b"\n")
  return path


BAD_LINES = [
    (b'{"id": 1, "problem": "no answer here"}', "line 2: missing answer"),
    (b'{"id": 2, "problem": "p", "answer": "3.5"}', "line 3: non-integer answer '3.5'"),
    (b'{"id": 3, "problem": "   ", "answer": 4}', "line 4: empty problem"),
    (b'{"id": 4, "problem": "p", "answer": 5', "line 5: malformed JSON"),
    (b'{"id": 5, "problem": "caf\xe9", "answer": 6}', "line 6: not valid UTF-8 at byte 25"),
    (b'[1, 2]', "line 7: expected a JSON object"),
    (b'{"id": 7, "problem": "p", "answer": ""}', "line 8: missing answer"),
]


@pytest.mark.parametrize("bad,message", BAD_LINES)
def test_bad_jsonl_row_names_file_and_row(tmp_path, bad, message):
  good = b'{"id": 0, "problem": "ok", "answer": 1}'
  lines = [good] + [b'{"id": 9, "problem": "q%d", "answer": 1}' % i for i in range(len(BAD_LINES))]
  lineno = int(re.match(r"line (\d+)", message).group(1))
  lines[lineno - 1] = bad
  path = _write_jsonl(tmp_path / "eval.jsonl", lines)
  with pytest.raises(ValueError, match=re.escape(f"{path}: {message}")):
    readers.load_examples("aime_2024", path=path)


def test_skip_bad_counts_and_logs(tmp_path, caplog):
  good = [b'{"id": 0, "problem": "ok", "answer": 1}', b'{"id": 1, "problem": "ok2", "answer": 2}']
  path = _write_jsonl(tmp_path / "eval.jsonl", good[:1] + [b for b, _ in BAD_LINES] + good[1:])
  with caplog.at_level(logging.WARNING):
    examples, rep = readers.load_examples("amc_2023", path=path, skip_bad=True)
  assert [e.id for e in examples] == ["0", "1"]
  assert rep.rows_in == 9 and rep.rows_out == 2 and len(rep.skipped) == len(BAD_LINES)
  assert [s["row"] for s in rep.skipped] == list(range(2, 2 + len(BAD_LINES)))
  assert sum("skipping" in r.message for r in caplog.records) == len(BAD_LINES)
  assert "7 bad rows skipped" in rep.summary()


def test_math500_keeps_non_integer_answers(tmp_path):
  path = _write_jsonl(tmp_path / "m.jsonl", [
      b'{"unique_id": "a", "problem": "p", "answer": "\\\\frac{1}{2}"}',
      b'{"unique_id": "b", "problem": "q", "answer": "10,\\\\!080"}'])
  examples, rep = readers.load_examples("math_500", path=path)
  assert [(e.id, e.answer, e.answer_is_int) for e in examples] == [
      ("a", "\\frac{1}{2}", False), ("b", "10080", True)]
  assert rep.non_integer == 1
  # The same file where integers are required fails on the first row.
  with pytest.raises(ValueError, match=r"line 1: non-integer answer"):
    readers.read_file(path, integer_answers=True)


def _dapo_table(**overrides):
  cols = {"prompt": [[{"content": "p1", "role": "user"}], [{"content": "p2", "role": "user"}]],
          "reward_model": [{"ground_truth": "1", "style": "rule"},
                           {"ground_truth": "2", "style": "rule"}],
          "extra_info": [{"index": 0, "split": "train"}, {"index": 1, "split": "train"}]}
  cols.update(overrides)
  return pa.table({k: v for k, v in cols.items() if v is not None})


def test_parquet_missing_columns(tmp_path):
  path = tmp_path / "bad.parquet"
  pq.write_table(_dapo_table(reward_model=None), path)
  with pytest.raises(ValueError, match=re.escape(f"{path}: parquet is missing column(s) "
                                                 "['reward_model.ground_truth']")):
    readers.read_file(path, integer_answers=True, skip_bad=True)  # file-level: never skipped
  pq.write_table(_dapo_table(reward_model=[{"style": "rule"}, {"style": "rule"}]), path)
  with pytest.raises(ValueError, match=r"missing column\(s\) \['reward_model.ground_truth'\]"):
    readers.read_file(path, integer_answers=True)


def test_parquet_bad_rows(tmp_path):
  path = tmp_path / "rows.parquet"
  pq.write_table(_dapo_table(reward_model=[{"ground_truth": "1", "style": "rule"},
                                           {"ground_truth": None, "style": "rule"}]), path)
  with pytest.raises(ValueError, match=re.escape(f"{path}: row 1: missing answer")):
    readers.read_file(path, integer_answers=True)
  examples, rep = readers.read_file(path, integer_answers=True, skip_bad=True)
  assert len(examples) == 1 and rep.skipped == [{"row": 1, "reason": "row 1: missing answer"}]
  # Non-UTF-8 text in a binary column.
  prompt = pa.array([[{"content": b"ok", "role": b"user"}], [{"content": b"\xff\xfe", "role":
                                                                b"user"}]])
  pq.write_table(_dapo_table(prompt=prompt), path)
  with pytest.raises(ValueError, match=r"row 1: problem is not valid UTF-8 at byte 0"):
    readers.read_file(path, integer_answers=True)
  pq.write_table(_dapo_table(prompt=[[{"content": "p", "role": "user"}], []]), path)
  with pytest.raises(ValueError, match=r"row 1: prompt holds no user message"):
    readers.read_file(path, integer_answers=True)


def test_file_level_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    readers.load_examples("aime_2024", path=tmp_path / "nope.jsonl")
  junk = tmp_path / "junk.parquet"
  junk.write_bytes(b"not parquet")
  with pytest.raises(ValueError, match=re.escape(f"{junk}: not a readable parquet file")):
    readers.read_file(junk, integer_answers=True)
  csv = tmp_path / "x.csv"
  csv.write_text("a,b\n")
  with pytest.raises(ValueError, match="unknown data format"):
    readers.read_file(csv, integer_answers=True)
  with pytest.raises(ValueError, match="name: unknown dataset 'gsm8k'"):
    readers.load_examples("gsm8k")


def test_env_override_of_shared_dir(tmp_path, monkeypatch):
  monkeypatch.setenv("DAPO_SHARED_DATA", str(tmp_path))
  assert readers.shared_data_dir() == tmp_path
  assert readers.default_path("dapo_math_17k") == tmp_path / "dapo_math_17k_svs.parquet"
  assert readers.default_path("aime_2024").parent == readers.ASSETS_DIR


def test_package_import_is_light():
  code = ("import sys, dapo_jax.data; "
          "print(json.dumps([m for m in ('tensorflow', 'tensorflow_datasets', 'transformers', "
          "'pyarrow') if m in sys.modules]))")
  out = subprocess.run([sys.executable, "-c", "import json; " + code], check=True,
                       capture_output=True, text=True).stdout
  assert json.loads(out) == []
  import dapo_jax.data as data  # pylint: disable=g-import-not-at-top
  assert data.SyntheticTask.__module__ == "dapo_jax.data.synthetic"
  assert data.load_examples is readers.load_examples and data.PREFIX == template.PREFIX
  with pytest.raises(AttributeError, match="no attribute 'nope'"):
    data.nope  # pylint: disable=pointless-statement


def test_math_500_easy_is_the_integer_answer_level_1_2_problems(shared, tmp_path):
  rows = [json.loads(line) for line in (shared / "math500_simplerl.jsonl").open()]
  want = {str(r["unique_id"]) for r in rows
          if r["level"] <= 2 and integer_answer(r["answer"]) is not None}
  easy = readers.load_math_500_easy(data_dir=shared)
  assert {e.id for e in easy} == want and len(easy) == 91
  assert all(e.answer_is_int and e.source == "math_500" for e in easy)
  assert len(readers.load_math_500_easy(data_dir=shared, max_level=1)) < len(easy)
  rows[3].pop("level")
  (tmp_path / "math500_simplerl.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  with pytest.raises(ValueError, match=r"math500_simplerl.jsonl: line 4: level must be an int"):
    readers.load_math_500_easy(data_dir=tmp_path)


def test_eval_name_math_500_easy_wiring(shared):
  from configs import tiny_cpu  # pylint: disable=g-import-not-at-top
  from dapo_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import setup  # pylint: disable=g-import-not-at-top
  c = tiny_cpu.get_config()
  c.task.eval_name, c.eval.num_problems = "math_500_easy", 0
  assert setup.load_task(config_lib.parse(c)).eval == readers.load_math_500_easy()
