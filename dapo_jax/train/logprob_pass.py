"""The prepare phase's no-gradient passes on packed rows: each mini-batch's packing plan
(`train/packing.py`), and the old / reference log-probs computed on the plan's micro-batches
that hold a sequence, one device call each, unpacked to the per-sequence [B, S] layout."""
import dataclasses
import functools

import jax
import numpy as np

from dapo_jax import sharding
from dapo_jax.config import Config
from dapo_jax.train import multihost, packing
from dapo_jax.train.objective import logprobs
from dapo_jax.train.batch import MiniBatch


def plans(cfg: Config, batch: MiniBatch) -> packing.PackPlan:
  """The packing plan of every mini-batch of `batch` (rows n·G + g), concatenated (so slicing
  rows per mini-batch slices the plans with them)."""
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  return packing.concat([
      packing.pack(batch.tokens_BxS[i:i + rows], batch.attn_mask_BxS[i:i + rows],
                   micro_batches=k, enabled=cfg.train.packing)
      for i in range(0, batch.num_seqs, rows)])


def with_plans(cfg: Config, batch: MiniBatch) -> MiniBatch:
  """`batch` with its packing plans (`plans`) and its recorded experts (routing replay) moved
  to the plans' packed rows, where the model reads them."""
  plan, ids = plans(cfg, batch), batch.expert_ids_BxSxLxK
  if ids is not None:
    rows, k = cfg.minibatch_seqs, cfg.micro_batches
    ids = np.concatenate([packing.to_rows(
        ids[i:i + rows], jax.tree.map(lambda x: x[i:i + rows], plan),
        batch.attn_mask_BxS[i:i + rows], micro_batches=k, fill=-1)
        for i in range(0, batch.num_seqs, rows)])
  return dataclasses.replace(batch, pack=plan, expert_ids_BxSxLxK=ids)


def packed_token_share(cfg: Config, batch: MiniBatch) -> float:
  """Real tokens / the positions the update computes (micro-batches run x rows x seq_len)."""
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  micro = batch.pack.micro_B
  runs = sum(packing.num_micro(micro[i:i + rows]) for i in range(0, len(micro), rows))
  return float(batch.attn_mask_BxS.sum()) / (runs * (rows // k) * batch.tokens_BxS.shape[1])


@functools.partial(jax.jit, static_argnames=("graphdef", "temperature", "with_entropy", "mesh"))
def logprob_fn(params, tokens_BxS, segments_BxS, positions_BxS, expert_ids_BxSxLxK=None, *,
               graphdef, temperature, with_entropy, mesh):
  """Log-probs (and entropies) of packed rows (segment 0 = padding); expert_ids: the rows'
  recorded experts to route by (routing replay)."""
  return logprobs(graphdef, params, tokens_BxS, segments_BxS > 0, temperature=temperature,
                  with_entropy=with_entropy, positions_BxS=positions_BxS,
                  segment_ids_BxS=segments_BxS, mesh=mesh,
                  expert_ids_BxSxLxK=expert_ids_BxSxLxK)[:2]


def _dispatch(run, params, batch: MiniBatch, with_entropy):
  """[(first row of the mini-batch, micro-batch i, device outputs)] for every used one."""
  cfg, dsh, plan = run.cfg, sharding.data_sharding(run.mesh), batch.pack
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  calls = []
  for m0 in range(0, batch.num_seqs, rows):
    for i in range(packing.num_micro(plan.micro_B[m0:m0 + rows])):
      ids = () if batch.expert_ids_BxSxLxK is None else (batch.expert_ids_BxSxLxK,)
      x = [multihost.put(a[m0 + i:m0 + rows:k], dsh)
           for a in (plan.tokens_BxS, plan.segments_BxS, plan.positions_BxS, *ids)]
      with jax.transfer_guard("disallow"):  # inputs are placed explicitly above
        calls.append((m0, i, logprob_fn(params, *x, graphdef=run.model.graphdef, mesh=run.mesh,
                                        temperature=cfg.rollout.temperature,
                                        with_entropy=with_entropy)))
  return calls


def batched_logprobs(run, params, batch: MiniBatch, *, with_entropy: bool):
  """(log-probs, entropies or None) [B, S] of every sequence of `batch` (its plan's rows)
  under `params` (host float32)."""
  cfg = run.cfg
  rows, k = cfg.minibatch_seqs, cfg.micro_batches
  calls = _dispatch(run, params, batch, with_entropy)
  outs = multihost.to_host([c[2] for c in calls])
  shape = batch.tokens_BxS.shape
  packed = [np.zeros(shape, np.float32) for _ in range(2 if with_entropy else 1)]
  for (m0, i, _), out in zip(calls, outs):
    for dst, src in zip(packed, out):
      dst[m0 + i:m0 + rows:k] = np.asarray(src)
  result = [np.concatenate([
      packing.unpack(p[m0:m0 + rows], batch.rows(m0, m0 + rows).pack,
                     batch.attn_mask_BxS[m0:m0 + rows], micro_batches=k)
      for m0 in range(0, shape[0], rows)]) for p in packed]
  return result[0], (result[1] if with_entropy else None)
