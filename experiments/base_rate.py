"""The untrained model's rate on a task at each difficulty: the table a config's difficulty is
picked from (DAPO needs a base that is sometimes right, or every group is all-wrong).

  python experiments/base_rate.py --config=configs/smollm2_cpu.py --difficulties=1,2,3 \
      --out=experiments/results/smollm2/base_rate.json
  # another eval set or model: --override=KEY=VALUE (config fields, repeatable), e.g.
  python experiments/base_rate.py --config=configs/smollm2_cpu.py --difficulties=1 \
      --override=task.eval_name=math_500_easy --override=eval.num_problems=0 \
      --override=model.hf_path=runs/smollm2/export

Per difficulty it runs the config's own evaluation on the model before any update (the eval
split, eval.num_problems x eval.num_samples at eval.temperature / eval.top_p, the config's chat
template, stop tokens and max_new_tokens) and prints one table row: avg@k with its 95 % CI,
format rate (responses with a readable "Answer:" line), the shares of problems whose k samples
are all right / all wrong (what dynamic sampling would drop at G = k), mean length, truncated
share and seconds. The config must take a `difficulty` option (configs/smollm2_cpu.py does).
"""
import argparse
import ast
import json
import os
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from dapo_jax import config as config_lib  # noqa: E402
from dapo_jax.train import rounds, trainer  # noqa: E402

COLUMNS = ("difficulty", "avg@k", "ci95", "format_rate", "all_right", "all_wrong",
           "length_mean", "truncated", "seconds")


def _load_config(path: str, difficulty: int, overrides=()):
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("base_rate_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config(f"difficulty={difficulty}")
  for item in overrides:
    key, sep, text = item.partition("=")
    section, _, field = key.partition(".")
    if not sep or not field or section not in c or field not in c[section]:
      raise SystemExit(f"--override={item}: expected SECTION.FIELD=VALUE naming a config field")
    try:
      value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
      value = text  # a bare string such as a path or a set name
    c[section][field] = value
  return config_lib.parse(c)


def measure(config_path: str, difficulty: int, overrides=()) -> dict:
  cfg = _load_config(config_path, difficulty, overrides)
  t0 = time.time()
  with tempfile.TemporaryDirectory() as workdir:
    run = trainer.build(cfg, workdir, resume=False)
    e = rounds.run_eval(run, f"base_d{difficulty}")
  k = cfg.eval.num_samples
  return {"difficulty": difficulty, "k": k, "num_problems": e["num_problems"],
          "avg@k": e[f"avg@{k}"], "ci95": [e[f"avg@{k}_ci_lo"], e[f"avg@{k}_ci_hi"]],
          "format_rate": e["format_rate"], "all_right": e["all_correct_frac"],
          "all_wrong": 1.0 - e[f"pass@{k}"], "length_mean": e["response_length_mean"],
          "truncated": e["truncated_frac"], "seconds": time.time() - t0, "shown": e["shown"]}


def _row(r: dict) -> str:
  cells = [str(r["difficulty"]), f"{r['avg@k']:.3f}",
           f"[{r['ci95'][0]:.3f}, {r['ci95'][1]:.3f}]"]
  cells += [f"{r[c]:.3f}" for c in ("format_rate", "all_right", "all_wrong")]
  cells += [f"{r['length_mean']:.1f}", f"{r['truncated']:.3f}", f"{r['seconds']:.0f}"]
  return "| " + " | ".join(cells) + " |"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--config", required=True, help="config file with a difficulty option")
  ap.add_argument("--difficulties", default="1,2,3", help="comma-separated difficulties")
  ap.add_argument("--override", action="append", default=[],
                  help="SECTION.FIELD=VALUE applied to the config (repeatable)")
  ap.add_argument("--out", help="JSON file for the rows (with a few responses each)")
  args = ap.parse_args(argv)
  try:
    levels = [int(x) for x in args.difficulties.split(",")]
  except ValueError as e:
    raise SystemExit(f"--difficulties: expected comma-separated integers, got "
                     f"{args.difficulties!r}") from e
  print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS), flush=True)
  rows = []
  for d in levels:
    rows.append(measure(args.config, d, args.override))
    print(_row(rows[-1]), flush=True)
    if args.out:  # after every row, so an interrupted table keeps what it measured
      os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
      with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"config": args.config, "overrides": args.override, "rows": rows}, f,
                  indent=1)


if __name__ == "__main__":
  main()
