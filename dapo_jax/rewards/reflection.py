"""Reflection tracker (DAPO §4.4, Table 2): how often responses re-check or backtrack, and what
changing an answer mid-response does to correctness. Host-side text processing, no JAX.

On when `log.reflection_phrases` (comma-separated, case-insensitive, matched as whole words) is
non-empty; e.g. "wait,let me check,let me verify,double-check,recheck,actually,mistake,
alternatively". A task with its own re-check line format lists that line's marker (the synthetic
task's responses are bare "a+b=c" lines, so a marker such as "check" only appears if a policy
learns to write one). Per step, over the responses of the update batch:

  reflect_frac           share of responses containing at least one phrase
  reflect_frac_correct   the same among responses the verifier marks correct (NaN if none)
  reflect_frac_wrong     the same among wrong responses (NaN if none)
  answer_change_frac     share of responses whose first stated answer differs from the final one
  answer_right_to_wrong_frac / answer_wrong_to_right_frac   share whose first answer was
                         right and final wrong / first wrong and final right

An answer is "stated" at each `Answer:` marker (or, with none, each `\\boxed{`); the answer at a
marker is what the reward function reads from the text up to the next marker, so the first and
final answers are judged exactly as the verifier judges a whole response.
"""
import math
import re
from typing import Callable, Sequence

import numpy as np

_ANSWER_RE = re.compile(r"answer\s*[:：]", re.IGNORECASE)
_BOX_RE = re.compile(r"\\(?:boxed|fbox)\{")


def parse_phrases(spec: str, where: str = "config.log.reflection_phrases") -> tuple[str, ...]:
  """Comma-separated phrases -> lowercased tuple; "" -> () (tracker off)."""
  if not isinstance(spec, str):
    raise ValueError(f"{where}: expected a comma-separated string, got {type(spec).__name__}")
  phrases = tuple(p.strip().lower() for p in spec.split(",")) if spec.strip() else ()
  if any(not p for p in phrases):
    raise ValueError(f"{where}: empty phrase in {spec!r} (stray comma?)")
  return phrases


def phrase_pattern(phrases: Sequence[str]) -> re.Pattern:
  """One regex matching any phrase as whole words, case-insensitive."""
  if not phrases:
    raise ValueError("phrases: need at least one phrase")
  alts = "|".join(re.escape(p) for p in sorted(phrases, key=len, reverse=True))
  return re.compile(rf"(?<!\w)(?:{alts})(?!\w)", re.IGNORECASE)


def answer_trajectory(text: str, truth: str, reward_fn: Callable) -> list[tuple[str, bool]]:
  """[(prediction, correct)] at each stated answer of `text`, in order (see module doc)."""
  marks = [m.start() for m in _ANSWER_RE.finditer(text)]
  if not marks:
    marks = [m.start() for m in _BOX_RE.finditer(text)]
  out = []
  for i in range(len(marks)):
    end = marks[i + 1] if i + 1 < len(marks) else len(text)
    _, correct, pred = reward_fn(text[:end], truth)
    if pred is not None:
      out.append((pred, bool(correct)))
  return out


def response_flags(text: str, truth: str, *, pattern: re.Pattern, reward_fn: Callable) -> dict:
  """Per-response booleans: reflects, changed, right_to_wrong, wrong_to_right."""
  traj = answer_trajectory(text, truth, reward_fn)
  (first, first_ok), (last, last_ok) = (traj[0], traj[-1]) if traj else ((None, False),) * 2
  return {"reflects": pattern.search(text) is not None, "changed": first != last,
          "right_to_wrong": first_ok and not last_ok, "wrong_to_right": last_ok and not first_ok}


def batch_metrics(texts: Sequence[str], truths: Sequence[str], correct: Sequence[bool], *,
                  phrases: Sequence[str], reward_fn: Callable) -> dict:
  """The module doc's metrics over parallel lists of responses, truths and verifier verdicts."""
  if not (len(texts) == len(truths) == len(correct)):
    raise ValueError(f"texts/truths/correct: lengths differ ({len(texts)}, {len(truths)}, "
                     f"{len(correct)})")
  pattern = phrase_pattern(phrases)
  flags = [response_flags(t, a, pattern=pattern, reward_fn=reward_fn)
           for t, a in zip(texts, truths)]
  col = lambda k: np.array([f[k] for f in flags], bool)
  ok, refl = np.asarray(correct, bool), col("reflects")
  share = lambda x: float(x.mean()) if x.size else math.nan
  return {"reflect_frac": share(refl), "reflect_frac_correct": share(refl[ok]),
          "reflect_frac_wrong": share(refl[~ok]), "answer_change_frac": share(col("changed")),
          "answer_right_to_wrong_frac": share(col("right_to_wrong")),
          "answer_wrong_to_right_frac": share(col("wrong_to_right"))}


def groups_metrics(groups, *, decode: Callable, phrases: Sequence[str],
                   reward_fn: Callable) -> dict:
  """batch_metrics over every response of a train.groups.Groups (one batched decode)."""
  N, G = groups.lengths.shape
  rows = [groups.tokens[n, g, :groups.lengths[n, g]].tolist() for n in range(N) for g in range(G)]
  texts = decode(rows) if rows else []
  truths = [groups.answers[i // G] for i in range(N * G)]
  return batch_metrics(texts, truths, groups.correct.reshape(-1), phrases=phrases,
                       reward_fn=reward_fn)


def step_metrics(groups, *, spec: str, decode: Callable, reward_fn: Callable) -> dict:
  """The trainer's per-step call: groups_metrics for `spec` (log.reflection_phrases); {} if ""."""
  phrases = parse_phrases(spec)
  if not phrases:
    return {}
  return groups_metrics(groups, decode=decode, phrases=phrases, reward_fn=reward_fn)
