"""Peer of bench_sampler.py: HF `generate` (torch CPU, KV cache) on the same model, 16
prompts x 16 samples (num_return_sequences), 64-token random prompts, exactly 128 new tokens,
temperature 1. Run with the peer venv, never inside a JAX process:

    /tmp/peer_venv/bin/python benchmarks/peers/hf_generate.py --model=HF_DIR --json=F
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_common as common  # pylint: disable=g-import-not-at-top,wrong-import-position


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--model", required=True)
  for name, default in (("prompts", 16), ("group", 16), ("prompt_len", 64), ("new", 128),
                        ("reps", 2)):
    ap.add_argument(f"--{name}", type=int, default=default)
  ap.add_argument("--json")
  args = ap.parse_args()
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
  model.eval()
  rng = np.random.default_rng(0)
  ids = torch.as_tensor(rng.integers(4, model.config.vocab_size, (args.prompts, args.prompt_len)))

  def gen(x, group, new):
    with torch.inference_mode():
      return model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=True,
                            temperature=1.0, top_p=1.0, top_k=0, num_return_sequences=group,
                            max_new_tokens=new, min_new_tokens=new, eos_token_id=None,
                            pad_token_id=0)

  gen(ids[:2], 2, 4)  # warm-up
  load0, rates = common.loadavg(), []
  for _ in range(args.reps):
    t0 = time.perf_counter()
    out = gen(ids, args.group, args.new)
    rates.append(out[:, args.prompt_len:].numel() / (time.perf_counter() - t0))
  s = common.summary(rates)
  common.write_json(args.json, dict(side="HF generate", tok_per_s=s["median"],
                                    tok_per_s_range=s, threads=torch.get_num_threads(),
                                    loadavg_before=load0, loadavg_after=common.loadavg()))


if __name__ == "__main__":
  main()
