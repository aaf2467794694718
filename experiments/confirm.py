"""A pre-registered campaign's confirmatory verdicts, by its registered design only.

COMMAND (the design's power at the registration's planning effects; no runs read):
  python experiments/confirm.py --registration=experiments/preregistration/testbed_confirm.json --plan
COMMAND (the looks taken so far and each claim's verdict; --verdicts also writes them into
  verdicts.json, replacing that family's confirmatory records and keeping every other record):
  python experiments/confirm.py --registration=experiments/preregistration/testbed_confirm.json \
      [--results=experiments/results] [--verdicts=experiments/results/verdicts.json]
EXPECTED: the registered runs finished so far (of arms x seeds), the looks taken (a look of n
  seeds needs every arm of the first n registered seeds finished), then one line per claim:
  difference a - b at the look that decided it (or the last look taken), raw p, sequential p,
  Holm-adjusted p, the repeated confidence interval, and the verdict (reproduced, refuted,
  bounded, undecided). The logic is dapo_jax/analysis/confirm.py's.
"""
import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from dapo_jax.analysis import ablations, confirm  # noqa: E402


def _fmt(v, spec=".3g"):
  return "—" if v is None or (isinstance(v, float) and not math.isfinite(v)) else format(v, spec)


def render(reg, runs, records) -> str:
  done = confirm.finished_seeds(reg, runs)
  names = reg.run_names()
  finished = sum(1 for n in names if n in runs and runs[n].results.get("after"))
  lines = [f"{reg.campaign}: {finished} of {len(names)} registered runs finished; "
           f"complete seeds {len(done)}; looks registered {list(reg.looks)}, taken "
           f"{records[0]['looks_taken'] if records else []} (family α {reg.alpha})"]
  for r in records:
    head = f"- {r['id']}: {r['a']} − {r['b'] or '0'} on {r['metric']} ({r['expected']})"
    if not r["seeds"]:
      lines.append(f"{head}: no look taken -> {r['verdict']}")
      continue
    lines.append(
        f"{head}: {_fmt(r['diff'], '+.4f')} at look {r['look']} ({r['seeds']} seeds), raw p "
        f"{_fmt(r['p'])}, sequential p {_fmt(r['q'])}, Holm p {_fmt(r['p_adj'])}; repeated CI "
        f"[{_fmt(r['repeated_ci_low'], '+.4f')}, {_fmt(r['repeated_ci_high'], '+.4f')}] "
        f"-> {r['verdict']}")
  return "\n".join(lines)


def merge_verdicts(path: str, records: list[dict]) -> list[dict]:
  """verdicts.json's records with this family's confirmatory ones replaced by `records`."""
  old = []
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      old = json.load(f)
  family = {r["family"] for r in records}
  keep = [r for r in old if not (r.get("phase") == "confirmatory" and r["family"] in family)]
  return records + keep


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--registration", required=True)
  p.add_argument("--results", default="experiments/results")
  p.add_argument("--plan", action="store_true", help="print the design's power and stop")
  p.add_argument("--verdicts", default=None, help="also write the records into this file")
  args = p.parse_args(argv)
  reg = confirm.load_registration(args.registration)
  if args.plan:
    print(f"{reg.campaign}: looks {list(reg.looks)}, O'Brien–Fleming, Holm over "
          f"{len(reg.claims)} claims at family α {reg.alpha} (power of each claim alone at "
          f"α / {len(reg.claims)})")
    for row in confirm.plan(reg):
      print(f"- {row['id']}: effect {row['effect']:.3f} sd ({row['effect_label']}): power "
            f"{row['power']:.3f}")
    return
  root = os.path.join(args.results, reg.runs)
  runs = ablations.load_runs(root) if os.path.isdir(root) else {}
  records = confirm.decide(reg, runs)
  print(render(reg, runs, records))
  if args.verdicts:
    ablations.write_verdicts(merge_verdicts(args.verdicts, records), args.verdicts)


if __name__ == "__main__":
  main()
