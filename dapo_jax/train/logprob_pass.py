"""The prepare phase's no-gradient passes on packed rows: each mini-batch's packing plan
(`train/packing.py`), and the old / reference log-probs computed on the plan's micro-batches
that hold a sequence, one device call each, unpacked to the per-sequence [B, S] layout."""
import functools

import jax
import numpy as np

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.train import multihost, packing
from dapo_jax.train.train_step import logprobs


def plans(cfg: Config, arrays: dict) -> dict:
  """pack_* arrays [B, S] / [B] of every mini-batch of `arrays` (rows n·G + g), concatenated
  (so slicing rows per mini-batch slices the plans with them)."""
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  parts = [packing.pack(arrays["tokens"][i:i + rows], arrays["attn_mask"][i:i + rows],
                        micro_batches=k, enabled=cfg.train.packing)
           for i in range(0, arrays["tokens"].shape[0], rows)]
  return {name: np.concatenate([p[name] for p in parts]) for name in packing.KEYS}


def packed_token_share(cfg: Config, arrays: dict) -> float:
  """Real tokens / the positions the update computes (micro-batches run x rows x seq_len)."""
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  micro = arrays["pack_micro"]
  runs = sum(packing.num_micro(micro[i:i + rows]) for i in range(0, len(micro), rows))
  return float(arrays["attn_mask"].sum()) / (runs * (rows // k) * arrays["tokens"].shape[1])


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "with_entropy", "mesh"))
def logprob_fn(params, tokens_BxS, segments_BxS, positions_BxS, *, graphdef, temperature,
               with_entropy, mesh):
  """Log-probs (and entropies) of packed rows (segment 0 = padding)."""
  return logprobs(graphdef, params, tokens_BxS, segments_BxS > 0, temperature=temperature,
                  with_entropy=with_entropy, positions_BxS=positions_BxS,
                  segment_ids_BxS=segments_BxS, mesh=mesh)


def _dispatch(run, params, arrays, with_entropy):
  """[(first row of the mini-batch, micro-batch i, device outputs)] for every used one."""
  cfg, dsh = run.cfg, sharding.data_sharding(run.mesh)
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  calls = []
  for m0 in range(0, arrays["tokens"].shape[0], rows):
    for i in range(packing.num_micro(arrays["pack_micro"][m0:m0 + rows])):
      put = lambda name: multihost.put(arrays[name][m0 + i:m0 + rows:k], dsh)
      x = [put(n) for n in ("pack_tokens", "pack_segments", "pack_positions")]
      with jax.transfer_guard("disallow"):  # inputs are placed explicitly above
        calls.append((m0, i, logprob_fn(params, *x, graphdef=run.graphdef, mesh=run.mesh,
                                        temperature=cfg.rollout.temperature,
                                        with_entropy=with_entropy)))
  return calls


def batched_logprobs(run, params, arrays: dict, *, with_entropy: bool):
  """(log-probs, entropies or None) [B, S] of every sequence under `params` (host float32)."""
  cfg = run.cfg
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  calls = _dispatch(run, params, arrays, with_entropy)
  outs = multihost.to_host([c[2] for c in calls])
  shape = arrays["tokens"].shape
  packed = [np.zeros(shape, np.float32) for _ in range(2 if with_entropy else 1)]
  for (m0, i, _), out in zip(calls, outs):
    for dst, src in zip(packed, out):
      dst[m0 + i:m0 + rows:k] = np.asarray(src)
  result = [np.concatenate([
      packing.unpack(p[m0:m0 + rows], {n: arrays[n][m0:m0 + rows] for n in packing.KEYS},
                     arrays["attn_mask"][m0:m0 + rows], micro_batches=k)
      for m0 in range(0, shape[0], rows)]) for p in packed]
  return result[0], (result[1] if with_entropy else None)
