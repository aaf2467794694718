"""tensorflow-datasets builders: dapo_math_17k, aime_2024, aime_2025, amc_2023, math_500.

Importing this module registers the five builders with tfds:

  import tensorflow_datasets as tfds
  from dapo_jax.data import tfds_builders
  ds = tfds.load("aime_2024", split="test")                       # vendored copy
  b = tfds.builder("dapo_math_17k", data_dir=d,                   # from a local file or dir
                   config=tfds_builders.MathConfig(name="local", path="../shared/data"))
  b.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=...))

Where the source file comes from, first match wins: config.url (downloaded by tfds), config.path
(a file, or a directory holding the default file name), the TFDS manual dir, then the default of
readers.default_path (vendored eval sets, or the shared data dir / $DAPO_SHARED_DATA for
DAPO-Math-17k). config.path, the manual dir and tfds' data_dir may each be local or a URL
(gs://...): read through dapo_jax.workdir.paths and tfds' own epath. Rows are read by readers.read_file,
so TFDS and the plain readers yield the same examples; the dedup/skip report is kept in the
dataset's metadata (info.metadata["report"]).
"""
import dataclasses
import logging
import os
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from dapo_jax.workdir import paths
from dapo_jax.data import readers

_CITATION = """@article{yu2025dapo,
  title={DAPO: An Open-Source LLM Reinforcement Learning System at Scale},
  author={Yu, Qiying and others}, journal={arXiv preprint arXiv:2503.14476}, year={2025}}"""


@dataclasses.dataclass(eq=False)
class MathConfig(tfds.core.BuilderConfig):
  """Where the builder reads from. Give a custom config a name other than "default"."""
  path: str | None = None  # a data file, or a directory holding the dataset's default file name
  url: str | None = None  # http(s) URL of a .parquet / .jsonl file, fetched by tfds
  skip_bad: bool = False  # skip (and count) bad rows instead of failing on the first


class _MathBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared body of the five builders; subclasses set `name` and the description."""
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [MathConfig(name="default", description="Default source location.")]
  DESCRIPTION = ""

  @property
  def MANUAL_DOWNLOAD_INSTRUCTIONS(self):  # pylint: disable=invalid-name
    return (f"Optional: put {readers.DATASETS[self.name].filename} in the manual dir, or pass "
            "config=MathConfig(name=..., path=... or url=...).")

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.DESCRIPTION,
        features=tfds.features.FeaturesDict({
            "id": tfds.features.Text(doc="Source id (extra_info.index, id or unique_id)."),
            "problem": tfds.features.Text(doc="Problem text, stripped of outer whitespace."),
            "prompt": tfds.features.Text(doc="template.PREFIX + problem + template.SUFFIX."),
            "answer": tfds.features.Text(
                doc="Canonical integer string if answer_is_int, else the source's answer text."),
            "answer_is_int": tfds.features.Scalar(
                dtype=np.bool_, doc="False only for MATH-500's non-integer (LaTeX) answers."),
        }),
        supervised_keys=("prompt", "answer"),
        homepage="https://github.com/BytedTsinghua-SIA/DAPO",
        citation=_CITATION,
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager):
    spec = readers.DATASETS[self.name]
    path = self._source_path(dl_manager)
    examples, report = readers.read_file(path, integer_answers=spec.integer_answers,
                                         source=self.name, skip_bad=self.builder_config.skip_bad)
    logging.info("%s: %s", self.name, report.summary())
    self.info.metadata["report"] = dataclasses.asdict(report)
    return {spec.split: self._generate_examples(examples)}

  def _generate_examples(self, examples):
    for i, e in enumerate(examples):
      # Keys are positions after dedup: source ids repeat in the hub copy (100x per item).
      yield i, {"id": e.id, "problem": e.problem, "prompt": e.prompt, "answer": e.answer,
                "answer_is_int": e.answer_is_int}

  def _source_path(self, dl_manager) -> pathlib.Path:
    cfg, filename = self.builder_config, readers.DATASETS[self.name].filename
    if cfg.url:
      return pathlib.Path(dl_manager.download(cfg.url))
    if cfg.path:  # local or a URL (gs://...)
      path = paths.resolve(cfg.path)
      return path / filename if path.is_dir() else path
    try:
      manual = paths.resolve(os.fspath(dl_manager.manual_dir)) / filename
    except AssertionError:  # no manual dir given, or it is empty
      manual = None
    if manual is not None and manual.exists():
      return manual
    path = readers.default_path(self.name)
    if not path.is_file():
      raise FileNotFoundError(f"{self.name}: no source file; looked for {filename} in the manual "
                              f"dir and at {path}. {self.MANUAL_DOWNLOAD_INSTRUCTIONS}")
    return path


class DapoMath17k(_MathBuilder):
  name = "dapo_math_17k"
  DESCRIPTION = ("DAPO-Math-17k: 17,917 competition problems with integer answers, in the DAPO "
                 "prompt template; de-duplicated by (problem, answer).")


class Aime2024(_MathBuilder):
  name = "aime_2024"
  DESCRIPTION = "AIME 2024 I+II, 30 problems with integer answers."


class Aime2025(_MathBuilder):
  name = "aime_2025"
  DESCRIPTION = "AIME 2025 I+II, 30 problems with integer answers."


class Amc2023(_MathBuilder):
  name = "amc_2023"
  DESCRIPTION = "AMC 2023, 40 problems with integer answers."


class Math500(_MathBuilder):
  name = "math_500"
  DESCRIPTION = ("MATH-500 (Lightman et al.): 500 problems; 316 integer answers, the rest kept as "
                 "LaTeX strings with answer_is_int=False.")
