"""Update throughput: the trainer's own jitted DAPO update (`trainer.jitted_update`) on
`--batch` all-response rows of `--seq` tokens, fp32 AdamW (peer: peers/torch_update.py).

    python benchmarks/bench_update.py --model=HF_DIR --batch=16 --seq=512 --json=F

Rows are random token ids >= 4, every position a response token (attention and loss masks all
1), advantages +-1, old log-probs from the trainer's log-prob pass (`logprob_pass.logprob_fn`), lr
1e-6, eps 0.2 / 0.28, token-mean loss. One warm-up update (compilation), then `--reps` timed
updates; `tok_per_s` = batch x seq / the median update time (in `F` with the log-prob pass's
rate). `--scan_layers` picks the model's layer loop (ModelConfig.scan_layers) for A/B runs.
"""
import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # dapo_jax
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position


def bench_config(model_dir: str, *, rows: int, seq: int, group: int = 16,
                 prompt_len: int | None = None, reward: str | None = None,
                 micro_batch: int | None = None, model_overrides=()):
  """The trainer's Config for these benchmarks: configs/tiny_cpu.py with the model at
  `model_dir`, one mini-batch of `rows` sequences of `seq` tokens (prompt_len of them the
  prompt; default a quarter) in gradient-accumulation slices of `micro_batch` sequences (None:
  one slice; the same update either way), the peers' loss settings (clip 0.2 / 0.28, token-mean,
  no KL, no overlong shaping)."""
  from configs import tiny_cpu  # pylint: disable=g-import-not-at-top
  from dapo_jax import config as config_lib  # pylint: disable=g-import-not-at-top
  c = tiny_cpu.get_config()
  c.model.source, c.model.hf_path, c.model.vocab_size = "hf", model_dir, 0
  c.task.tokenizer = model_dir
  c.task.max_prompt_len = prompt_len or seq // 4
  c.rollout.max_new_tokens = seq - c.task.max_prompt_len
  if reward:
    c.task.reward = reward
  c.rollout.group_size = group
  c.rollout.num_slots = max(rows, group)
  c.train.batch_size = rows // group
  c.train.num_minibatches = 1
  c.train.micro_batch_size = micro_batch
  c.algo.dynamic_sampling = False
  c.algo.eps_low, c.algo.eps_high, c.algo.loss_agg = 0.2, 0.28, "token-mean"
  c.algo.overlong_filter = c.algo.overlong_penalty = False
  c.algo.overlong_cache_len = 0
  c.algo.kl_coef = c.algo.entropy_coef = 0.0
  c.optim.lr, c.optim.warmup_steps, c.warm_start.steps = 1e-6, 0, 0
  for item in model_overrides:  # "attention_chunk=256": A/B runs of a config.model run field
    key, value = item.split("=", 1)
    kind = type(c.model[key])
    if kind is bool and value not in ("True", "False"):
      raise ValueError(f"--model_override {item!r}: {key} takes True or False")
    c.model[key] = value == "True" if kind is bool else kind(value)
  return config_lib.parse(c)


def build_run(model_dir: str, *, rows: int, seq: int, scan_layers=None, group: int = 16,
              micro_batch: int | None = None, model_overrides=()):
  """trainer.build on the benchmark config; `scan_layers` (None: the config's) sets
  config.model.scan_layers, the layer loop, for an A/B run."""
  import tempfile  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import trainer  # pylint: disable=g-import-not-at-top
  if scan_layers is not None:
    model_overrides = (*model_overrides, f"scan_layers={scan_layers}")
  cfg = bench_config(model_dir, rows=rows, seq=seq, group=min(group, rows),
                     micro_batch=micro_batch, model_overrides=model_overrides)
  return trainer.build(cfg, tempfile.mkdtemp(prefix="bench_"), resume=False)


def random_rows(vocab: int, rows: int, seq: int, seed: int = 0):
  """A full-length MiniBatch of random tokens, advantages +-1 (old log-probs filled in later)."""
  from dapo_jax.train.batch import MiniBatch  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(seed)
  ones = np.ones((rows, seq), np.float32)
  return MiniBatch(tokens_BxS=rng.integers(4, vocab, size=(rows, seq)).astype(np.int32),
                   attn_mask_BxS=ones, loss_mask_BxS=ones,
                   adv_B=np.where(np.arange(rows) % 2, 1.0, -1.0).astype(np.float32))


def run(args) -> dict:
  import dataclasses  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from dapo_jax.train import logprob_pass, trainer  # pylint: disable=g-import-not-at-top
  r = build_run(args.model, rows=args.batch, seq=args.seq, scan_layers=args.scan_layers,
                micro_batch=args.micro_batch, model_overrides=args.model_override)
  batch = random_rows(r.model.model_config.vocab_size, args.batch, args.seq)
  segments = batch.attn_mask_BxS.astype(np.int32)  # one sequence per row
  positions = np.broadcast_to(np.arange(args.seq, dtype=np.int32), (args.batch, args.seq))
  logp_fn = lambda: logprob_pass.logprob_fn(
      r.loop.state.params, batch.tokens_BxS, segments, positions, graphdef=r.model.graphdef,
      mesh=r.mesh,
      temperature=r.cfg.rollout.temperature, with_entropy=True)
  logp_fn()
  lp_times = [common.timed(logp_fn)[1] for _ in range(args.reps)]
  batch = dataclasses.replace(batch, old_logp_BxS=np.asarray(logp_fn()[0]))
  step_fn = trainer.jitted_update(r)
  load0, times, cpu = common.loadavg(), [], []
  for _ in range(args.reps + 1):  # the first is the warm-up (compilation)
    t0, c0 = time.perf_counter(), time.process_time()
    r.loop.state, m, _ = step_fn(r.loop.state, batch)
    jax.block_until_ready((r.loop.state, m))
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
  tokens = args.batch * args.seq
  s, lp = common.summary(times[1:]), common.summary(lp_times)
  # cpu_s: process CPU time per update, a steadier A/B figure than wall time on a busy machine.
  return dict(side="dapo_jax update", tok_per_s=tokens / s["median"], update_s=s,
              cpu_s=common.summary(cpu[1:]),
              logprob_tok_per_s=tokens / lp["median"], logprob_s=lp,
              scan_layers=r.model.model_config.scan_layers, loadavg_before=load0,
              loadavg_after=common.loadavg(),
              skipped=float(m["skipped"]),
              setting=dict(batch=args.batch, seq=args.seq, micro_batch=args.micro_batch),
              model_overrides=list(args.model_override))


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True, help="HF model directory")
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq", type=int, default=512)
  ap.add_argument("--reps", type=int, default=3, help="timed updates after the warm-up")
  ap.add_argument("--micro_batch", type=int, default=None,
                  help="sequences per gradient-accumulation slice (default: one slice)")
  ap.add_argument("--scan_layers", type=int, choices=(0, 1), default=None,
                  help="A/B: 1 = layers under lax.scan, 0 = unrolled (default: the model's)")
  ap.add_argument("--model_override", action="append", default=[], metavar="FIELD=VALUE",
                  help="A/B: a config.model run field, e.g. attention_impl=plain (repeatable)")
  ap.add_argument("--json", help="write the result here")
  args = ap.parse_args()
  if args.scan_layers is not None:
    args.scan_layers = bool(args.scan_layers)
  common.write_json(args.json, run(args))


if __name__ == "__main__":
  main()
