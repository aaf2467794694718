"""Peer of bench_rl_step.py: TRL's `GRPOTrainer(loss_type="dapo")` on the same model, at the
setting of the RL-step comparison (docs/performance.md). Run with the peer venv
(requirements-bench.txt), never inside a JAX process:

    /tmp/peer_venv/bin/python benchmarks/peers/trl_step.py --model=HF_DIR --prompts=16 \
        --group=16 --prompt_len=64 --new=128 --steps=4 --json=F

`--prompts` random prompts of ids >= 4 per step (written as the WordLevel tokenizer's words, so
they tokenize back to exactly `prompt_len` ids), `--group` samples each, exactly `new` tokens
per sample (`min_new_tokens`), reward +1 if token id 7 appears in the completion else -1, eps
0.2 / 0.28, no KL (beta 0), one update on all sequences (per-device batch = prompts x group, the
comparison's setting; `--micro_batch=M` accumulates it over slices of M), lr 1e-6, fp32, no
vLLM, CPU (`--device=cuda`: the GPU, with the allocator's peak as `peak_bytes`). F holds
{"step_s": median of steps 2.., "phases": {"generate", "rest"}}: `generate` is the time inside
the model's `generate`, `rest` the step's remainder (reward, log-probs, the update; TRL's
policy is its own model, so there is no weight sync).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position


def token7_reward(completion_ids, **unused):
  del unused
  return [1.0 if 7 in ids else -1.0 for ids in completion_ids]


def prompts_dataset(args, vocab: int):
  import datasets  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  ids = rng.integers(4, vocab, size=(args.prompts * args.steps, args.prompt_len))
  return datasets.Dataset.from_dict({"prompt": [" ".join(f"t{i}" for i in row) for row in ids]})


def timed_generate(model, log: list):
  """Wraps model.generate so every call's seconds land in `log`."""
  inner = model.generate

  def generate(*a, **k):
    t0 = time.perf_counter()
    out = inner(*a, **k)
    log.append(time.perf_counter() - t0)
    return out
  model.generate = generate


def load(args):
  """(tokenizer, fp32 model) of --model; the WordLevel tokenizer itself (AutoTokenizer would
  pick Qwen2's BPE class for this config)."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  tok = transformers.PreTrainedTokenizerFast.from_pretrained(args.model)
  if len(tok(" ".join(["t5"] * args.prompt_len))["input_ids"]) != args.prompt_len:
    raise AssertionError(f"--model: {args.model}'s tokenizer does not read t<i> as id i")
  return tok, transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)


def grpo_config(args, rows: int):
  """TRL's GRPOConfig at the comparison's setting (one update on all `rows` sequences)."""
  import tempfile  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top
  return trl.GRPOConfig(
      output_dir=tempfile.mkdtemp(prefix="trl_step_"), loss_type="dapo", epsilon=0.2,
      epsilon_high=0.28, beta=0.0, num_generations=args.group,
      max_completion_length=args.new, generation_kwargs={"min_new_tokens": args.new},
      per_device_train_batch_size=args.micro_batch,
      gradient_accumulation_steps=rows // args.micro_batch,
      bf16=False, gradient_checkpointing=False, use_vllm=False, use_cpu=args.device == "cpu",
      learning_rate=1e-6, max_steps=args.steps, logging_steps=1, save_strategy="no",
      report_to="none", shuffle_dataset=False, temperature=1.0, top_p=1.0, top_k=0)


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True)
  for name, default in (("prompts", 16), ("group", 16), ("prompt_len", 64), ("new", 128),
                        ("steps", 4), ("micro_batch", 0)):
    ap.add_argument(f"--{name}", type=int, default=default)
  ap.add_argument("--device", default="cpu", help="cpu, or cuda (the Trainer's GPU)")
  ap.add_argument("--json")
  args = ap.parse_args()
  rows = args.prompts * args.group
  args.micro_batch = args.micro_batch or rows
  if args.steps < 2:
    raise ValueError("--steps: need >= 2 (step 1 is the warm-up and is excluded)")
  if rows % args.micro_batch:
    raise ValueError(f"--micro_batch: {args.micro_batch} does not divide {rows} sequences")
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  import trl  # pylint: disable=g-import-not-at-top
  tok, model = load(args)
  gen_s, steps = [], []
  timed_generate(model, gen_s)
  cfg = grpo_config(args, rows)

  class StepTimer(transformers.TrainerCallback):
    def on_step_begin(self, *unused, **kw):
      self.t0 = time.perf_counter()

    def on_step_end(self, *unused, **kw):
      steps.append(time.perf_counter() - self.t0)

  trainer = trl.GRPOTrainer(model=model, reward_funcs=token7_reward, args=cfg,
                            train_dataset=prompts_dataset(args, model.config.vocab_size),
                            processing_class=tok, callbacks=[StepTimer()])
  load0 = common.loadavg()
  trainer.train()
  if len(steps) != args.steps or len(gen_s) != args.steps:
    raise AssertionError(f"expected {args.steps} steps with one generate each, got "
                         f"{len(steps)} steps, {len(gen_s)} generate calls")
  later = range(1, args.steps)
  common.write_json(args.json, dict(
      side="TRL GRPOTrainer (loss_type=dapo)", step_s=common.summary(steps[1:])["median"],
      step_s_range=common.summary(steps[1:]), steps_s=steps,
      phases={"generate": common.summary([gen_s[i] for i in later])["median"],
              "rest": common.summary([steps[i] - gen_s[i] for i in later])["median"]},
      threads=torch.get_num_threads(), versions={"trl": trl.__version__,
                                                 "torch": torch.__version__,
                                                 "transformers": transformers.__version__},
      loadavg_before=load0, loadavg_after=common.loadavg(), setting=vars(args),
      peak_bytes=torch.cuda.max_memory_allocated() if args.device.startswith("cuda") else None))


if __name__ == "__main__":
  main()
