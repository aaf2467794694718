"""One DAPO rollout step through the trainer's own code path (`trainer.build`,
`trainer.rollout_step`: collect -> prepare -> update -> sync), at the TRL peer's setting
(peer: peers/trl_step.py).

    python benchmarks/bench_rl_step.py --model=HF_DIR --prompts=16 --group=16 --prompt_len=64 \
        --new=128 --steps=4 --json=F

Random prompts of ids >= 4, exactly `new` tokens per sample (no EOS id), reward +1 if token id
7 appears in the response else -1, token-mean loss with eps 0.2 / 0.28, no dynamic sampling, no
overlong shaping, one update on all sequences (accumulated over slices of `--micro_batch`
sequences, default 16: the same update as one slice, which on 2 cores runs 1.6-2x faster at
this shape; peers/trl_step.py --micro_batch does the same on TRL's side),
lr 1e-6, then the weight sync. F holds
{"step_s": median of steps 2.., "phases": {phase: median seconds}} where the phases are the
trainer's own timer (rollout = generate + score, logprobs = old log-probs, update, sync) and
`host` the rest of the step.
"""
import argparse
import dataclasses
import os
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dapo_jax
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position
import bench_update  # pylint: disable=g-import-not-at-top,wrong-import-position

REWARD = "bench_token7"


def token7_reward(text: str, answer: str):
  """+1 if token id 7 is in the response (text = space-separated ids), else -1."""
  del answer
  hit = "7" in text.split()
  return (1.0 if hit else -1.0), hit, None


class RandomPrompts:
  """The trainer's prompt iterator replaced: `n` random prompts of ids >= 4 per round."""

  def __init__(self, n: int, length: int, vocab: int, seed: int = 0):
    self.n, self.length, self.vocab = n, length, vocab
    self.rng = np.random.default_rng(seed)
    self.num_truncated = 0  # PromptIterator's count of prompts cut (none here: fixed length)

  def __next__(self):
    ids = self.rng.integers(4, self.vocab, size=(self.n, self.length))
    return types.SimpleNamespace(prompt_ids=ids.tolist(), answers=[""] * self.n)

  def state(self):
    return {}


def build(args):
  from dapo_jax import rewards  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import trainer  # pylint: disable=g-import-not-at-top
  rewards.REWARD_FNS[REWARD] = token7_reward
  cfg = bench_update.bench_config(args.model, rows=args.prompts * args.group,
                                  seq=args.prompt_len + args.new, group=args.group,
                                  prompt_len=args.prompt_len, reward=REWARD,
                                  micro_batch=args.micro_batch)
  import tempfile  # pylint: disable=g-import-not-at-top
  run = trainer.build(cfg, tempfile.mkdtemp(prefix="bench_rl_"), resume=False)
  # No EOS (every sample runs `new` tokens); responses read as their ids for the reward.
  task = dataclasses.replace(run.task, eos_ids=())
  task.decode = lambda rows: [" ".join(map(str, r)) for r in rows]
  run = dataclasses.replace(run, task=task, data=RandomPrompts(
      args.prompts, args.prompt_len, run.model.model_config.vocab_size))
  return run, trainer


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True, help="HF model directory")
  for name, default in (("prompts", 16), ("group", 16), ("prompt_len", 64), ("new", 128),
                        ("steps", 4), ("micro_batch", 16)):
    ap.add_argument(f"--{name}", type=int, default=default)
  ap.add_argument("--json", help="write the result here")
  args = ap.parse_args()
  if args.steps < 2:
    raise ValueError("--steps: need >= 2 (step 1 compiles and is excluded)")
  run, trainer = build(args)
  step_fn = trainer.jitted_update(run)
  load0, steps, phases = common.loadavg(), [], []
  for _ in range(args.steps):
    t0 = time.perf_counter()
    m = trainer.rollout_step(run, step_fn)
    steps.append(time.perf_counter() - t0)
    run.loop.step += 1
    ph = {k[len("time_"):-len("_s")]: float(v) for k, v in m.items()
          if k.startswith("time_") and k.endswith("_s") and k != "time_step_s"}
    ph["host"] = steps[-1] - sum(ph.values())
    phases.append(ph)
    if m.get("tokens_generated", args.prompts * args.group * args.new) != (
        args.prompts * args.group * args.new):
      raise AssertionError(f"expected exactly {args.new} tokens per sample, got {m}")
  later = phases[1:]
  common.write_json(args.json, dict(
      side="dapo_jax rl step", step_s=common.summary(steps[1:])["median"],
      step_s_range=common.summary(steps[1:]), steps_s=steps,
      phases={k: common.summary([p[k] for p in later])["median"] for k in later[0]},
      loadavg_before=load0, loadavg_after=common.loadavg(), setting=vars(args)))


if __name__ == "__main__":
  main()
