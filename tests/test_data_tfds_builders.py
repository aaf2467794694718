"""Tests for dapo_jax.data.tfds_builders: the five builders built from the shared data.

Built in array_record format and read back with tfds data sources, so no TensorFlow is needed.
"""
import pytest
import tensorflow_datasets as tfds

from dapo_jax.data import readers, template
from dapo_jax.data import tfds_builders as tb

NAMES = ("dapo_math_17k", "aime_2024", "aime_2025", "amc_2023", "math_500")


def _build(name, data_dir, config=None, **kwargs):
  b = tfds.builder(name, data_dir=str(data_dir), config=config, file_format="array_record")
  b.download_and_prepare(**kwargs)
  return b


def _rows(builder):
  split = readers.DATASETS[builder.name].split
  return [{k: v.decode() if isinstance(v, bytes) else v for k, v in r.items()}
          for r in builder.as_data_source(split=split)]


@pytest.fixture(scope="module")
def shared_builds(tmp_path_factory):
  shared = readers.shared_data_dir()
  if not (shared / "SOURCES.md").is_file():
    pytest.fail(f"shared data not found at {shared}; set DAPO_SHARED_DATA")
  data_dir = tmp_path_factory.mktemp("tfds")
  cfg = tb.MathConfig(name="shared", path=str(shared))
  return {n: _build(n, data_dir, cfg) for n in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_builder_matches_reader(shared_builds, name):
  builder = shared_builds[name]
  examples, rep = readers.load_examples(name, data_dir=readers.shared_data_dir())
  split = readers.DATASETS[name].split
  assert list(builder.info.splits) == [split]
  assert builder.info.splits[split].num_examples == len(examples) == rep.rows_out
  report = builder.info.metadata["report"]
  assert report["rows_in"] == rep.rows_in and report["duplicates"] == rep.duplicates
  rows = _rows(builder)
  want = {(e.id, e.problem, e.prompt, e.answer, e.answer_is_int) for e in examples}
  got = {(r["id"], r["problem"], r["prompt"], r["answer"], bool(r["answer_is_int"]))
         for r in rows}
  assert got == want
  assert all(r["prompt"].encode() == (template.PREFIX + r["problem"] + template.SUFFIX).encode()
             for r in rows)


def test_row_counts(shared_builds):
  counts = {n: b.info.splits[readers.DATASETS[n].split].num_examples
            for n, b in shared_builds.items()}
  rep = shared_builds["dapo_math_17k"].info.metadata["report"]
  assert rep["rows_in"] == 17917 and counts["dapo_math_17k"] == 17917 - rep["duplicates"]
  assert (counts["aime_2024"], counts["aime_2025"], counts["amc_2023"], counts["math_500"]) == (
      30, 30, 40, 500)
  math500 = _rows(shared_builds["math_500"])
  assert sum(bool(r["answer_is_int"]) for r in math500) == 316
  # The metadata survives a reload from disk.
  again = tfds.builder("math_500", data_dir=shared_builds["math_500"].data_dir_root,
                       config=tb.MathConfig(name="shared"))
  assert again.info.metadata["report"]["non_integer"] == 184


def test_default_config_reads_the_vendored_copy(tmp_path):
  builder = _build("aime_2025", tmp_path)
  assert builder.info.metadata["report"]["file"] == str(readers.ASSETS_DIR / "aime25_areal.jsonl")
  assert builder.info.splits["test"].num_examples == 30


def _small_jsonl(path, extra=b""):
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(b'{"id": 1, "problem": "P one", "answer": "5"}\n'
                   b'{"id": 2, "problem": "P two", "answer": 6}\n' + extra)
  return path


def test_manual_dir_and_url_options(tmp_path, monkeypatch):
  manual = tmp_path / "manual"
  _small_jsonl(manual / "amc23_qwen25math.jsonl")
  builder = _build("amc_2023", tmp_path / "d1",
                   download_config=tfds.download.DownloadConfig(manual_dir=str(manual)))
  assert sorted(r["answer"] for r in _rows(builder)) == ["5", "6"]

  # url: fetched through tfds' download manager (stubbed here: there is no network).
  fetched = []

  def fake_download(self, url):  # pylint: disable=unused-argument
    fetched.append(url)
    return _small_jsonl(tmp_path / "dl" / "file.jsonl",
                        b'{"id": 3, "problem": "P3", "answer": 7}\n')

  monkeypatch.setattr(tfds.download.DownloadManager, "download", fake_download)
  cfg = tb.MathConfig(name="web", url="https://example.org/amc23.jsonl")
  builder = _build("amc_2023", tmp_path / "d2", cfg)
  assert fetched == ["https://example.org/amc23.jsonl"]
  assert sorted(r["id"] for r in _rows(builder)) == ["1", "2", "3"]


def test_bad_rows_fail_or_are_counted(tmp_path):
  bad = _small_jsonl(tmp_path / "bad.jsonl", b'{"id": 3, "problem": "P3"}\n{"id": 4\n')
  with pytest.raises(ValueError, match=f"{bad}: line 3: missing answer"):
    _build("aime_2024", tmp_path / "d1", tb.MathConfig(name="strict", path=str(bad)))
  builder = _build("aime_2024", tmp_path / "d2",
                   tb.MathConfig(name="lenient", path=str(bad), skip_bad=True))
  report = builder.info.metadata["report"]
  assert builder.info.splits["test"].num_examples == 2
  assert [s["row"] for s in report["skipped"]] == [3, 4]
  assert "malformed JSON" in report["skipped"][1]["reason"]


def test_missing_source_is_a_clear_error(tmp_path, monkeypatch):
  monkeypatch.setenv("DAPO_SHARED_DATA", str(tmp_path / "nowhere"))
  with pytest.raises(FileNotFoundError, match="dapo_math_17k: no source file"):
    _build("dapo_math_17k", tmp_path / "d")


def test_registered_with_tfds():
  for name in NAMES:
    assert tfds.builder_cls(name).name == name
    assert issubclass(tfds.builder_cls(name), tfds.core.GeneratorBasedBuilder)
