"""Peer of bench_update.py: one torch training step (causal-LM loss, loss.backward(),
AdamW.step(), fp32) on the same HF model and the same batch x seq random tokens.
Run with the peer venv (requirements-bench.txt), never inside a JAX process:

    /tmp/peer_venv/bin/python benchmarks/peers/torch_update.py --model=HF_DIR --json=F

`--device=cuda` runs it on the GPU (benchmarks/device_check.sh) and reports the peak of
torch's allocator (`peak_bytes`).
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
  ap.add_argument("--batch", type=int, default=16)
  ap.add_argument("--seq", type=int, default=512)
  ap.add_argument("--reps", type=int, default=3)
  ap.add_argument("--device", default="cpu", help="torch device: cpu or cuda")
  ap.add_argument("--json")
  args = ap.parse_args()
  import numpy as np  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
  model.to(args.device).train()
  cuda = args.device.startswith("cuda")
  opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.1)
  vocab = model.config.vocab_size
  ids = torch.as_tensor(np.random.default_rng(0).integers(4, vocab, (args.batch, args.seq)))
  ids = ids.to(args.device)
  times, load0 = [], common.loadavg()
  for _ in range(args.reps + 1):  # the first is the warm-up
    t0 = time.perf_counter()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    if cuda:
      torch.cuda.synchronize()
    times.append(time.perf_counter() - t0)
  s = common.summary(times[1:])
  common.write_json(args.json, dict(
      side="torch update", tok_per_s=args.batch * args.seq / s["median"], update_s=s,
      threads=torch.get_num_threads(), loadavg_before=load0, loadavg_after=common.loadavg(),
      device=args.device, peak_bytes=torch.cuda.max_memory_allocated() if cuda else None))


if __name__ == "__main__":
  main()
