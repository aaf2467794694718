"""What a base policy gives each DAPO technique to act on: the testbed's measured figures.

  python experiments/testbed_stats.py --config=configs/testbed_cpu.py \
      --models=/tmp/testbed_base/step_600,/tmp/testbed_base/step_800 --json=/tmp/stats.json
  # the committed figures (the shipped testbed base beside the tiny base, each on its own task):
  python experiments/testbed_stats.py --config=configs/testbed_cpu.py,configs/tiny_cpu.py \
      --json=experiments/results/testbed_base_stats.json

For each config (comma-separated) and model (an HF directory; default: the config's own base)
it samples `--rounds` batches
of train.batch_size training prompts x G at the config's rollout settings (T = 1, no update)
through the trainer's own functions, and prints one row: accuracy; entropy, nats per response
token, as the dashboard's `entropy` (the full next-token distribution, from the prepare phase's
log-prob pass); the truncated share (hit max_new_tokens: the overlong techniques' subject); the
shares of groups that are all-correct / all-wrong (what dynamic sampling drops); response
length mean / p90 / max; the share of responses with a re-check line and the accuracy with and
without one; and the accuracy per difficulty (operations per problem).
"""
import argparse
import json
import os
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dapo_jax import config as config_lib  # noqa: E402
from dapo_jax.data import synthetic, template, testbed  # noqa: E402
from dapo_jax.train import rounds, trainer  # noqa: E402
from experiments.launch import load_module  # noqa: E402


def _difficulty(run, prompt_ids) -> int:
  text = run.task.tokenizer.decode(prompt_ids, skip_special_tokens=True)
  return len(synthetic.parse_problem(template.split_prompt(text))[1])


def measure(c, num_rounds: int) -> dict:
  cfg = config_lib.parse(c)
  with tempfile.TemporaryDirectory() as workdir:
    run = trainer.build(cfg, workdir, resume=False)
    parts, ent_sum, ent_count = [], 0.0, 0.0
    for r in range(num_rounds):
      g = rounds.generate_round(run, r, cfg.train.batch_size)
      prep = trainer.prepare(run, g, separate_pass=True)
      ent_sum += float((prep.entropy_BxS * prep.resp_mask_BxS).sum())
      ent_count += float(prep.resp_mask_BxS.sum())
      parts.append(g)
    groups = trainer.groups_lib.Groups.concat(parts)
    texts = run.task.decode([list(t[:n]) for t, n in zip(groups.tokens.reshape(-1, groups.tokens.shape[-1]),
                                                          groups.lengths.reshape(-1))])
    diffs = np.repeat([_difficulty(run, p) for p in groups.prompts], groups.correct.shape[1])
  correct, lengths = groups.correct.reshape(-1), groups.lengths.reshape(-1)
  acc_g = groups.correct.mean(1)
  check = np.array([testbed.RECHECK.strip() in t for t in texts])
  return {
      "samples": int(correct.size), "accuracy": float(correct.mean()),
      "entropy": ent_sum / max(ent_count, 1.0), "truncated": float(groups.truncated.mean()),
      "groups_all_correct": float((acc_g == 1).mean()), "groups_all_wrong": float((acc_g == 0).mean()),
      "length_mean": float(lengths.mean()), "length_p90": float(np.percentile(lengths, 90)),
      "length_max": int(lengths.max()), "recheck_share": float(check.mean()),
      "acc_with_recheck": float(correct[check].mean()) if check.any() else None,
      "acc_without_recheck": float(correct[~check].mean()) if (~check).any() else None,
      "acc_by_difficulty": {int(d): float(correct[diffs == d].mean()) for d in np.unique(diffs)},
  }


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", default="configs/testbed_cpu.py", help="comma-separated files")
  ap.add_argument("--models", default="", help="comma-separated HF dirs; default the config's")
  ap.add_argument("--rounds", type=int, default=4, help="batches of train.batch_size prompts")
  ap.add_argument("--json", default="", help="write the rows here")
  args = ap.parse_args()
  rows = {}
  for spec, model in ((s, m) for s in args.config.split(",")
                      for m in (args.models.split(",") if args.models else [""])):
    path, _, arg = spec.partition(":")
    c = load_module(path).get_config(arg or None)
    if model:
      c.model.source, c.model.hf_path = "hf", model
    c.log.progress = c.log.tensorboard = False
    c.algo.dynamic_sampling = False  # rounds of exactly train.batch_size prompts, none dropped
    rows[model or c.model.hf_path] = row = measure(c, args.rounds)
    print(f"{model or c.model.hf_path}: " + ", ".join(
        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  main()
