"""The record every dataset here yields, the skip/dedup report, and answer normalisation."""
import dataclasses
import hashlib
import math
import re

# An integer, optionally with thousands separators as MATH writes them ("10,\!080", "58,500"),
# a leading "\$" or "$", or a zero fraction ("27.0", what amc23's float answers print as).
_INT_RE = re.compile(r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.0*)?")


@dataclasses.dataclass(frozen=True)
class Example:
  """One problem. `prompt` is the full DAPO prompt (template.PREFIX + problem + template.SUFFIX).

  `answer` is the ground truth passed to rewards.math_answer.score: a canonical integer string
  ("-12") when `answer_is_int`, else the source's answer text (MATH-500's LaTeX answers).
  `solution` is a reference response ending in "Answer: N" where one exists (the synthetic task).
  """
  id: str
  problem: str
  prompt: str
  answer: str
  answer_is_int: bool = True
  solution: str | None = None
  source: str = ""


@dataclasses.dataclass
class SkipReport:
  """What a reader did to a file: rows read, kept, dropped as duplicates, skipped as bad."""
  file: str
  rows_in: int = 0
  rows_out: int = 0
  duplicates: int = 0  # rows dropped because (problem, answer) was already kept
  stripped: int = 0  # problems whose leading/trailing whitespace was removed
  templated: int = 0  # rows whose prompt came wrapped in the DAPO template (hub format)
  non_integer: int = 0  # kept answers that are not integers (flagged answer_is_int=False)
  conflicting: int = 0  # problems kept with more than one distinct answer
  blank: int = 0  # blank lines of a jsonl file, skipped (no row)
  skipped: list = dataclasses.field(default_factory=list)  # [{"row": r, "reason": why}]

  def summary(self) -> str:
    return (f"{self.file}: {self.rows_in} rows in -> {self.rows_out} out; "
            f"{self.duplicates} duplicate (problem, answer) dropped, {len(self.skipped)} bad rows "
            f"skipped, {self.non_integer} non-integer answers flagged, {self.conflicting} problems "
            f"with conflicting answers, {self.stripped} problems stripped of whitespace, "
            f"{self.templated} rows unwrapped from the DAPO template, {self.blank} blank lines "
            f"skipped")


def integer_answer(value) -> str | None:
  """Canonical integer string for an answer value (int, whole float, or text), else None."""
  if isinstance(value, bool):
    return None
  if isinstance(value, int):
    return str(value)
  if isinstance(value, float):
    return str(int(value)) if math.isfinite(value) and value.is_integer() else None
  if not isinstance(value, str):
    return None
  s = value.strip().replace("\\!", "").replace(" ", "")
  s = s.removeprefix("\\$").removeprefix("$")
  if not _INT_RE.fullmatch(s):
    return None
  return str(int(s.split(".")[0].replace(",", "")))


# ----- generated task families (synthetic, arith_nl) ------------------------------------------
SPLITS = ("train", "heldout")


def check_int_fields(obj, ranges, *, prefix: str = ""):
  """Each (field, lo, hi) of `obj` an int in [lo, hi], and obj.seed an int; errors name
  `prefix + field`."""
  for name, lo, hi in ranges:
    value = getattr(obj, name)
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
      raise ValueError(f"{prefix}{name}: expected an int in [{lo}, {hi}], got {value!r}")
  if isinstance(obj.seed, bool) or not isinstance(obj.seed, int):
    raise ValueError(f"{prefix}seed: expected an int, got {obj.seed!r}")


def split_of(problem: str, heldout_percent: int) -> str:
  """'heldout' or 'train', from a hash of the problem text alone (independent of the seed)."""
  h = int.from_bytes(hashlib.sha256(problem.encode()).digest()[:8], "big")
  return "heldout" if h % 100 < heldout_percent else "train"


def check_examples_args(split: str, n: int):
  if split not in SPLITS:
    raise ValueError(f"split: expected one of {SPLITS}, got {split!r}")
  if isinstance(n, bool) or not isinstance(n, int) or n < 0:
    raise ValueError(f"n: expected an int >= 0, got {n!r}")
