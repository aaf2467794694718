"""Fuzzes the answer verifier (rewards.math_answer.score) with random and adversarial responses.

  python experiments/fuzz_verifier.py --count=100000 --seed=0   # a few minutes, one core

Each case is drawn from one of the generators below (random text, random code points, deep
`\\boxed{` nesting, 100k-character lines, Unicode digits, NUL bytes, huge numbers, brace and
marker floods, decorated right answers, hedges between two numbers). Cases whose verdict is known
(a decorated right answer, a hedge, a NUL byte) are also checked against it. Prints the latency
p50/p99/max of score(), the exceptions (score() counts them in verifier_errors()) and the
verdict mismatches; exits 1 unless there is no exception, no mismatch, p99 <= 10 ms and
max <= 200 ms, in the calling thread's CPU time (wall time is printed too: on a shared machine
other processes inflate it).
"""
import argparse
import os
import random
import sys
import time
import traceback

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dapo_jax import rewards  # noqa: E402  pylint: disable=wrong-import-position
from dapo_jax.rewards import math_answer  # noqa: E402  pylint: disable=wrong-import-position

P99_TARGET_MS, MAX_TARGET_MS = 10.0, 200.0
LONG = 100_000  # characters: the "100k-character line" generators
# Decimal digit zeros of a few scripts (Arabic-Indic, Extended Arabic-Indic, Devanagari,
# fullwidth, Bengali, Thai, Mathematical bold); digit d is chr(zero + d).
DIGIT_ZEROS = (0x660, 0x6F0, 0x966, 0xFF10, 0x9E6, 0xE50, 0x1D7CE)
DECORATIONS = ("{}", "${}$", "\\boxed{{{}}}", "**{}**", "{}.", "({})", "x = {}", "{}^\\circ",
               "\\text{{{}}}", "$\\boxed{{{}}}$.", "{} degrees", "\\({}\\)", "{},", "`{}`")
HEDGES = ("x = {a} or x = {b}", "{a}, y = {b}", "{a} = {b}", "{a} {b}", "{a}, {b}",
          "\\boxed{{{a}}} or \\boxed{{{b}}}", "{a} or {b}", "$x = {a}$ and $x = {b}$")


def _random_text(rng: random.Random) -> tuple:
  alphabet = "0123456789 \n{}\\$.,=()*xAnswer:boxed-+^°٤４\x00"
  text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(300)))
  return text, str(rng.randrange(1000)), None


def _random_code_points(rng: random.Random) -> tuple:
  text = "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randrange(200)))
  return "Answer: " + text if rng.random() < 0.5 else text, str(rng.randrange(100)), None


def _deep_boxed(rng: random.Random) -> tuple:
  depth = rng.choice((10, 31, 33, 1000, 50_000, 100_000))
  closing = depth if rng.random() < 0.5 else rng.randrange(depth)
  body = "\\boxed{" * depth + "42" + "}" * closing
  return ("Answer: " + body if rng.random() < 0.5 else body), "42", None


def _long_line(rng: random.Random) -> tuple:
  alphabet = rng.choice(("0123456789", "0123456789 ,", "{}", "$*", " ", "\\boxed{", "4\x002"))
  line = "".join(rng.choice(alphabet) for _ in range(LONG // 10)) * 10
  return rng.choice(("Answer: ", "", "Answer:\n", "answer ")) + line, "42", None


def _unicode_digits(rng: random.Random) -> tuple:
  n = rng.randrange(10**6)
  zero = rng.choice(DIGIT_ZEROS)
  return "Answer: " + "".join(chr(zero + int(d)) for d in str(n)), str(n), True


def _nul_byte(rng: random.Random) -> tuple:
  text = f"Reasoning.\nAnswer: {rng.randrange(10**6)}"
  i = rng.randrange(len(text) + 1)
  return text[:i] + "\x00" * rng.randrange(1, 4) + text[i:], text.rsplit(" ", 1)[1], False


def _huge_number(rng: random.Random) -> tuple:
  n = str(rng.randrange(1, 10)) + "".join(rng.choice("0123456789")
                                          for _ in range(rng.randrange(5000)))
  if rng.random() < 0.5:
    return "Answer: " + n, n, True
  return "Answer: " + n[:-1] + str((int(n[-1]) + 1) % 10), n, False


def _flood(rng: random.Random) -> tuple:
  unit = rng.choice(("{", "}", "$", "(", "Answer:", "answer ", "\\boxed{", "\\(", "**", "\n",
                     "1,", "x = ", "=", "^\\circ", "\\text{", " square"))
  return unit * (LONG // len(unit)) + rng.choice(("", " 42", "Answer: 42")), "42", None


def _decorated(rng: random.Random) -> tuple:
  n = rng.randrange(-10**4, 10**9)
  s = rng.choice((str(n), f"{n:,}", f"{n}.0", f"0{n}" if n >= 0 else str(n)))
  wrappers = rng.sample(DECORATIONS, rng.randrange(1, 4))  # distinct: one "x = " at most
  for w in wrappers:
    s = w.format(s)
  prefix = rng.choice(("Answer: ", "answer:", "**Answer:** ", "Answer:\n\n"))
  return "Let me think.\n" + prefix + s, str(n), True


def _hedge(rng: random.Random) -> tuple:
  n = rng.randrange(10**6)
  a, b = sorted((n, n + rng.randrange(1, 100)), key=lambda _: rng.random())
  return "Answer: " + rng.choice(HEDGES).format(a=a, b=b), str(n), False


GENERATORS = (_random_text, _random_code_points, _deep_boxed, _long_line, _unicode_digits,
              _nul_byte, _huge_number, _flood, _decorated, _hedge)


def _one(text: str, gt: str, expect, report: dict, kind: str) -> tuple:
  """(wall ms, CPU ms) of one score() call; failures go into report."""
  errors_before = rewards.verifier_errors()
  t0, c0 = time.perf_counter(), time.thread_time()
  _, correct, _ = math_answer.score(text, gt)
  ms = 1e3 * (time.perf_counter() - t0), 1e3 * (time.thread_time() - c0)
  if rewards.verifier_errors() != errors_before:
    report["exceptions"] += 1
    try:  # re-run unguarded to show the cause
      math_answer.judge(text, gt)
    except Exception:  # pylint: disable=broad-except  # reported, and the run exits 1
      report["examples"].append(f"{kind}: {traceback.format_exc(limit=3)}")
  elif expect is not None and correct != expect:
    report["mismatches"] += 1
    report["examples"].append(f"{kind}: expected {expect}, got {correct}: {text[:120]!r} vs {gt!r}")
  return ms


def run(count: int, seed: int) -> dict:
  """Scores `count` cases drawn with `seed`; returns latencies (ms) and failure counts."""
  rng = random.Random(seed)
  report = {"exceptions": 0, "mismatches": 0, "examples": [], "per_kind_max_ms": {}}
  ms_Cx2 = np.zeros((count, 2))  # [wall, CPU] milliseconds per case
  for i in range(count):
    gen = GENERATORS[i % len(GENERATORS)] if i < len(GENERATORS) else rng.choice(GENERATORS)
    kind = gen.__name__.lstrip("_")
    text, gt, expect = gen(rng)
    ms_Cx2[i] = _one(text, gt, expect, report, kind)
    worst = report["per_kind_max_ms"].get(kind, (0.0, 0.0))
    report["per_kind_max_ms"][kind] = tuple(np.maximum(worst, ms_Cx2[i]))
  for j, clock in enumerate(("wall", "cpu")):
    report.update({f"{clock}_p50_ms": float(np.percentile(ms_Cx2[:, j], 50)),
                   f"{clock}_p99_ms": float(np.percentile(ms_Cx2[:, j], 99)),
                   f"{clock}_max_ms": float(ms_Cx2[:, j].max())})
  report["count"] = count
  return report


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--count", type=int, default=100_000, help="cases to score")
  ap.add_argument("--seed", type=int, default=0, help="seed of the case generator")
  args = ap.parse_args(argv)
  if args.count < 1:
    ap.error(f"--count: must be >= 1, got {args.count}")
  t0 = time.perf_counter()
  r = run(args.count, args.seed)
  for line in r["examples"][:10]:
    print(line)
  for kind, (wall, cpu) in sorted(r["per_kind_max_ms"].items()):
    print(f"  {kind:<20} max wall {wall:8.3f} ms  cpu {cpu:8.3f} ms")
  for clock in ("wall", "cpu"):
    print(f"{clock:>4}: p50={r[clock + '_p50_ms']:.3f} ms p99={r[clock + '_p99_ms']:.3f} ms "
          f"max={r[clock + '_max_ms']:.3f} ms")
  # Targets on the thread's CPU time: other processes on a shared machine inflate wall time.
  ok = (r["exceptions"] == 0 and r["mismatches"] == 0 and r["cpu_p99_ms"] <= P99_TARGET_MS
        and r["cpu_max_ms"] <= MAX_TARGET_MS)
  print(f"count={r['count']} seed={args.seed} exceptions={r['exceptions']} "
        f"mismatches={r['mismatches']} wall={time.perf_counter() - t0:.0f} s "
        f"load={os.getloadavg()[0]:.1f} targets={'met' if ok else 'MISSED'}")
  return 0 if ok else 1

if __name__ == "__main__":
  sys.exit(main())
