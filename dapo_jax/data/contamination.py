"""Train/eval contamination check by word n-gram overlap.

  python -m dapo_jax.data.contamination --train dapo_math_17k \\
      --eval aime_2024,aime_2025,amc_2023,math_500 --n 13 --threshold 0.5

Texts are normalised (NFKC, case-folded, split into runs of letters/digits, so LaTeX markup and
punctuation do not hide a copy). An eval item's overlap is the fraction of its distinct word
n-grams that occur anywhere in the train set; items with fewer than n words count as overlapping
(1.0) when their whole word sequence occurs inside a train problem. Items at or above the threshold
are listed with the train item sharing the most n-grams and whether the answers agree.
"""
import argparse
import bisect
import collections
import dataclasses
import json
import re
import unicodedata

from dapo_jax.data import readers

_WORD_RE = re.compile(r"[^\W_]+")


def words(text: str) -> list[str]:
  return _WORD_RE.findall(unicodedata.normalize("NFKC", text).casefold())


def ngrams(tokens: list[str], n: int) -> set[int]:
  # Python's hash of a tuple is stable within one process, which is all an in-memory index needs.
  return {hash(tuple(tokens[i:i + n])) for i in range(len(tokens) - n + 1)}


@dataclasses.dataclass
class ItemOverlap:
  eval_set: str
  eval_id: str
  overlap: float  # share of the item's n-grams found anywhere in train
  short: bool  # fewer than n words: overlap is 1.0 iff its word sequence occurs in a train item
  best_train_id: str | None  # the train item sharing the most n-grams
  best_share: float  # share of the item's n-grams found in that one train item
  answers_agree: bool | None
  problem: str


class TrainIndex:
  """Word n-grams of a train set, each mapped to the first train item holding it."""

  def __init__(self, train, *, n: int):
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
      raise ValueError(f"n: expected an int >= 1, got {n!r}")
    self.n, self.train = n, train
    self.owner = {}
    texts, self.offsets, pos = [], [], 0
    for i, e in enumerate(train):
      toks = words(e.problem)
      for g in ngrams(toks, n):
        self.owner.setdefault(g, i)
      text = " " + " ".join(toks) + " \n"
      texts.append(text)
      self.offsets.append(pos)
      pos += len(text)
    self.joined = "".join(texts)  # for items shorter than n words

  def check(self, eval_set: str, e) -> ItemOverlap:
    toks = words(e.problem)
    if len(toks) < self.n:
      at = self.joined.find(" " + " ".join(toks) + " ") if toks else -1
      best = bisect.bisect_right(self.offsets, at) - 1 if at >= 0 else None
      overlap = share = float(best is not None)
      short = True
    else:
      grams = ngrams(toks, self.n)
      owners = collections.Counter(self.owner[g] for g in grams if g in self.owner)
      overlap = sum(owners.values()) / len(grams)
      best = owners.most_common(1)[0][0] if owners else None
      share = len(grams & ngrams(words(self.train[best].problem), self.n)) / len(grams) if (
          best is not None) else 0.0
      short = False
    t = self.train[best] if best is not None else None
    return ItemOverlap(eval_set=eval_set, eval_id=e.id, overlap=overlap, short=short,
                       best_train_id=t.id if t else None, best_share=share,
                       answers_agree=(t.answer == e.answer) if t else None, problem=e.problem)


def check(train, eval_sets: dict, *, n: int = 13) -> list[ItemOverlap]:
  """Overlap of every item of every eval set (name -> list[Example]) with `train`."""
  index = TrainIndex(train, n=n)
  return [index.check(name, e) for name, items in eval_sets.items() for e in items]


def format_report(results: list[ItemOverlap], *, train_name: str, n_train: int, n: int,
                  threshold: float) -> str:
  """A markdown summary table and the list of items at or above `threshold`."""
  if not 0.0 <= threshold <= 1.0:
    raise ValueError(f"threshold: expected a fraction in [0, 1], got {threshold}")
  lines = [f"Train: {train_name} ({n_train} problems after dedup). n = {n} words, "
           f"threshold = {threshold}.", "",
           "| eval set | items | any overlap | >= threshold | of which answers agree "
           "| max overlap | short items (< n words) |", "|---|---|---|---|---|---|---|"]
  by_set = collections.defaultdict(list)
  for r in results:
    by_set[r.eval_set].append(r)
  flagged = [r for r in results if r.overlap >= threshold]
  for name, rs in by_set.items():
    hit = [r for r in rs if r.overlap >= threshold]
    lines.append(f"| {name} | {len(rs)} | {sum(r.overlap > 0 for r in rs)} | {len(hit)} | "
                 f"{sum(bool(r.answers_agree) for r in hit)} | "
                 f"{max(r.overlap for r in rs):.2f} | {sum(r.short for r in rs)} |")
  lines += ["", f"Items with overlap >= {threshold}: {len(flagged)}"]
  for r in sorted(flagged, key=lambda r: (r.eval_set, -r.overlap)):
    snippet = " ".join(r.problem.split())[:90]
    lines.append(f"- {r.eval_set} id {r.eval_id}: overlap {r.overlap:.2f}"
                 f"{' (short item)' if r.short else ''}; best train id {r.best_train_id} "
                 f"shares {r.best_share:.2f}; answers {'agree' if r.answers_agree else 'differ'}"
                 f"; \"{snippet}\"")
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--train", default="dapo_math_17k", help="dataset name (readers.DATASETS)")
  parser.add_argument("--eval", default="aime_2024,aime_2025,amc_2023,math_500",
                      help="comma-separated dataset names")
  parser.add_argument("--n", type=int, default=13, help="n-gram length in words")
  parser.add_argument("--threshold", type=float, default=0.5, help="overlap fraction to list")
  parser.add_argument("--data_dir", default=None,
                      help="directory holding the files (default: vendored / shared data)")
  parser.add_argument("--json", default=None, help="also write every item's overlap here")
  args = parser.parse_args(argv)
  train, _ = readers.load_examples(args.train, data_dir=args.data_dir)
  evals = {name: readers.load_examples(name, data_dir=args.data_dir)[0]
           for name in args.eval.split(",") if name}
  results = check(train, evals, n=args.n)
  print(format_report(results, train_name=args.train, n_train=len(train), n=args.n,
                      threshold=args.threshold))
  if args.json:
    with open(args.json, "w") as f:
      json.dump([dataclasses.asdict(r) for r in results], f, indent=1)


if __name__ == "__main__":
  main()
