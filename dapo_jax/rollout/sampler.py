"""Group sampler: G samples per prompt with prefix fan-out and continuous batching.

Each prompt is prefilled once and its prefix inserted into the G slots of its samples (a peer
prefills every sample, wasting G - 1 prefills per prompt). Samples are queued in (prompt, sample)
order; when one ends (EOS or its length budget) its slot takes the next queued sample before the
next decode step (an Orca-style scheduler: the long tail of one group overlaps with new work).
Every sample draws token t with the key fold_in(fold_in(fold_in(seed, prompt), sample), t), so
results do not depend on which slot runs a sample or when it finishes.

The weights are the engine's at each device call: `between_chunks` (a partial rollout's weight
sync, train/pipeline.py) may replace them between two decode chunks, and every token records
the policy version that drew it. In-flight sequences keep the KV entries of their earlier
tokens (computed under the older weights) rather than being prefilled again.
"""
import dataclasses
import math
import numbers
import time
from typing import Callable

import jax
import numpy as np

from dapo_jax.rollout import book as book_lib
from dapo_jax.rollout import flops
from dapo_jax.rollout import pages
from dapo_jax.rollout import sampling
from dapo_jax.rollout.engine import Engine


@dataclasses.dataclass
class GroupRollout:
  """Samples of N prompts x G, right-padded to T = max_new_tokens (numpy, host).

  tokens: int32 [N, G, T], 0 after the end. logprobs: float32 [N, G, T], behaviour log-prob of
  each token under the full temperature-scaled distribution, 0 on padding. versions: int32
  [N, G, T], the policy version (`GroupSampler.version`) that drew each token, 0 on padding.
  lengths: int32 [N, G], EOS included when produced. truncated: bool [N, G], stopped by
  max_new_tokens or max_len without EOS. stats: scheduler figures (see sample_groups).
  With an engine that records experts (routing replay): expert_ids int16 [N, G, T, Lm, K], the
  experts each response token went through in each MoE layer, and prompt_expert_ids int16
  [N, P, Lm, K] (P = max_prompt_len) the prompt tokens'; -1 past the ends; else None.
  """
  tokens: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  lengths: np.ndarray
  truncated: np.ndarray
  stats: dict
  expert_ids: np.ndarray | None = None
  prompt_expert_ids: np.ndarray | None = None


@dataclasses.dataclass
class PagingTally:
  """The paged KV cache's pressure over one rollout step's generation rounds, all hosts:
  samples preempted (stopped for lack of pages, re-run from their start) and the most of one
  batch shard's pages held at once (1.0: a shard's pool ran full; 0 for the dense cache).
  Evaluations are not counted. Both are per batch shard, so a host count that leaves each
  shard the same rows leaves them unchanged (1 and 2 processes: tests/test_multihost.py)."""
  preemptions: int = 0
  pool_peak_frac: float = 0.0

  def add(self, per_host_Nx2: np.ndarray) -> None:
    """One round's [hosts, 2] (preemptions, pool_peak_frac) (train.multihost.per_process)."""
    self.preemptions += int(per_host_Nx2[:, 0].sum())
    self.pool_peak_frac = max(self.pool_peak_frac, float(per_host_Nx2[:, 1].max()))

  def take(self) -> dict:
    """The step's metrics `sampler_preemptions` and `sampler_pool_peak_frac`; starts over."""
    out = {"sampler_preemptions": self.preemptions, "sampler_pool_peak_frac": self.pool_peak_frac}
    self.preemptions, self.pool_peak_frac = 0, 0.0
    return out


def _int_arg(value, name: str, lo: int, hi: int | None = None) -> int:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < lo or (
      hi is not None and value > hi):
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise ValueError(f"{name}: must be an int {rng}, got {value!r}")
  return int(value)


class GroupSampler:
  """Host-side scheduler over an Engine's jitted prefill / insert / generate_chunk."""

  def __init__(self, engine: Engine, *, prefill_batch: int | None = None):
    self.engine = engine
    self.version = 0  # the policy version of the engine's weights (the trainer's step count)
    self._prefill_batch = (None if prefill_batch is None
                           else _int_arg(prefill_batch, "prefill_batch", 1))

  def update_params(self, params, version: int | None = None) -> None:
    """Weight sync: the trainer's nnx.Param state (any mesh, any processes) moved
    device-to-device onto the sampler's mesh in its dtype; the old copy is freed first.
    `version` (default: one more than now) is recorded on every token drawn from then on."""
    self.engine.load_params(params, free_old=True)
    self.version = self.version + 1 if version is None else int(version)

  def _check_counts(self, group_size, max_new_tokens, prompt_offset) -> tuple[int, int, int]:
    g = _int_arg(group_size, "group_size", 1)
    slots = self.engine.max_concurrent_decodes
    if g > slots:
      raise ValueError(f"group_size: {g} exceeds num_slots={slots}; a group's samples share one "
                       "prefix and must fit in the slots together")
    return (g, _int_arg(max_new_tokens, "max_new_tokens", 1),
            _int_arg(prompt_offset, "prompt_offset", 0))

  def _check_prompts(self, prompts) -> list[np.ndarray]:
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
      raise ValueError(f"prompts: expected a list of token-id lists, got {type(prompts).__name__}")
    if len(prompts) == 0:
      raise ValueError("prompts: empty list; need at least one prompt")
    vocab, limit = self.engine.cfg.vocab_size, self.engine.max_prefill_length
    out = []
    for i, p in enumerate(prompts):
      a = np.asarray(p)
      if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise ValueError(f"prompts[{i}]: expected a flat list of int token ids, got shape "
                         f"{a.shape} dtype {a.dtype}")
      if a.size == 0:
        raise ValueError(f"prompts[{i}]: empty prompt; every prompt needs at least one token")
      if a.size > limit:
        raise ValueError(f"prompts[{i}]: {a.size} tokens exceed max_prompt_len={limit} (the "
                         "prefill limit); truncate it or build the sampler with a larger one")
      if a.min() < 0 or a.max() >= vocab:
        raise ValueError(f"prompts[{i}]: token id {int(a.min() if a.min() < 0 else a.max())} "
                         f"outside the vocabulary [0, {vocab})")
      out.append(a.astype(np.int32))
    return out

  def sample_groups(self, prompts, *, group_size: int, max_new_tokens: int,
                    temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, seed: int = 0,
                    eos_ids=(), prompt_offset: int = 0,
                    between_chunks: Callable[[], None] | None = None) -> GroupRollout:
    """Samples group_size responses for every prompt (a list of token-id lists).

    prompt_offset: index of the first prompt in the RNG fold (a host sampling prompts
    [o, o + n) of a larger batch draws the same samples as one host sampling the whole batch).
    between_chunks: called after every decode chunk; it may sync new weights
    (`update_params`), which the next chunk and every later token use (partial rollouts).

    stats: decode_steps (batched decode steps run), generate_calls (device calls of up to
    steps_per_call steps), slot_utilisation (generated tokens / (decode_steps x slots)),
    prefills (prompts prefilled: one each), prefill_calls, inserts (samples put into slots),
    prefill_tokens_saved and prefill_flops_saved (what prefilling every sample separately would
    have added), generated_tokens, wall_time_s, tokens_per_s, preemptions (paged: samples
    stopped for lack of pages and re-run from their start; counted in inserts too) and
    pages_peak (paged: most pool pages held at once; 0 for the dense cache) and pool_peak_frac
    (paged: the most of one batch shard's pages held at once; 0 for the dense cache).
    """
    eng, t0 = self.engine, time.perf_counter()
    g, t_max, offset = self._check_counts(group_size, max_new_tokens, prompt_offset)
    sp = sampling.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                 eos_ids=eos_ids).validated(eng.cfg.vocab_size)
    rows = self._check_prompts(prompts)
    n, b = len(rows), eng.max_concurrent_decodes
    pool = None if eng.paged is None else pages.PagePool(
        num_pages=eng.num_pages, shards=eng.batch_shards, slots=b,
        page_size=eng.paged.page_size, max_len=eng.max_len)
    run = _SampleCall(rows=rows, g=g, t_max=t_max, offset=offset,
               np_batch=self._prefill_batch or min(math.ceil(b / g), n),
               book=book_lib.SlotBook(n=n, g=g, t_max=t_max, slots=b, eos=sp.eos_ids,
                                      experts=_expert_shape(eng)), pool=pool,
               queue=book_lib.SampleQueue(n * g), st=eng.init_decode_state(sp))
    self._decode_until_done(run, between_chunks)
    stats = _stats(eng.cfg, run, [r.size for r in rows], slots=b,
                   wall=time.perf_counter() - t0)
    book = run.book
    return GroupRollout(tokens=book.tokens, logprobs=book.logprobs, versions=book.versions,
                        lengths=book.lengths, truncated=book.truncated, stats=stats,
                        expert_ids=book.experts, prompt_expert_ids=book.prompt_experts)

  def _decode_until_done(self, run: "_SampleCall",
                         between_chunks: Callable[[], None] | None) -> None:
    """Refills free slots and runs decode chunks until every queued sample has finished."""
    eng, pool = self.engine, run.pool
    while True:
      self._refill(run)
      if not run.book.busy():
        if run.queue.pending():  # cannot happen: an empty shard holds any one sample
          raise RuntimeError("sample_groups: samples wait but none could be admitted")
        return
      if pool is not None:
        self._grow(run)
      run.st, out = eng.generate_chunk(eng.params, run.st, stop_on_finish=run.queue.pending(),
                                       page_table=None if pool is None else pool.table)
      out = jax.device_get(out)
      run.chunks += 1
      run.steps += int(out["steps"])
      for slot in run.book.record_chunk(out, self.version):
        if pool is not None:
          pool.release(slot)
      if between_chunks is not None:
        between_chunks()

  def _refill(self, run: "_SampleCall") -> None:
    """Inserts queued samples (preempted ones first, then in (prompt, sample) order) into free
    slots before the next step, prefilling their prompts' batch when it is not the current
    one; a paged engine admits a sample only while its shard has pages for it."""
    eng, book, g = self.engine, run.book, run.g
    while book.free and run.queue.pending():
      ids = run.queue.peek(len(book.free))
      if run.prefix is None or not run.pb_start <= ids[0] // g < run.pb_start + run.np_batch:
        run.pb_start = int(ids[0] // g)
        run.prefix = self._prefill(eng.params, run.rows, run.pb_start, run.np_batch)
        if book.prompt_experts is not None:
          book.record_prompts(run.pb_start, np.asarray(run.prefix.expert_ids_NpxPxLxK))
        run.prefill_calls += 1
      inside = (ids // g >= run.pb_start) & (ids // g < run.pb_start + run.np_batch)
      ids = ids[:int(np.argmin(inside)) if not inside.all() else ids.size]
      writes = None
      if run.pool is not None:
        ids, writes = self._admit(run, ids)
        if ids.size == 0:
          return  # the pool is full: decode on until pages come back
      st = eng.insert_many(run.prefix, run.st, src=ids // g - run.pb_start,
                           slots=book.assign(ids), prompt_ids=ids // g + run.offset,
                           sample_ids=ids % g, max_new=np.full(ids.shape, run.t_max),
                           page_writes=writes)
      run.st = st
      run.queue.take(ids.size)

  def _admit(self, run: "_SampleCall", ids):
    """The leading samples of `ids` the pool takes into the next free slots, and the page
    copies their insert makes (prefix row, prompt page, pool page)."""
    writes, taken = [], 0
    for sid, slot in zip(ids, run.book.free):
      prompt = int(sid // run.g)
      got = run.pool.admit(slot, prompt, run.rows[prompt].size)
      if got is None:
        break
      writes += [(prompt - run.pb_start, j, page) for j, page in got]
      taken += 1
    return ids[:taken], writes

  def _grow(self, run: "_SampleCall") -> None:
    """Pages for every live row's next steps_per_call positions, oldest admitted first; when
    a shard runs out, its youngest sample is preempted (pages returned, re-run later from its
    start: its tokens are keyed by (prompt, sample, t), so it draws them again)."""
    book, pool, k = run.book, run.pool, self.engine.steps_per_call
    live = np.nonzero(book.owner >= 0)[0]
    for slot in live[np.argsort(book.admitted[live])]:
      sid = book.owner[slot]
      if sid < 0:
        continue
      plen = run.rows[sid // run.g].size
      budget = min(run.t_max, self.engine.max_len - plen)
      while not pool.grow(slot, plen + min(book.received[slot] + k, budget) - 1):
        same = np.nonzero((book.owner >= 0) & (pool.shard(slot) == np.arange(
            book.owner.size) // pool.rows_per_shard))[0]
        victim = int(same[np.argmax(book.admitted[same])])
        run.st = self.engine.evict(run.st, [victim])
        pool.release(victim)
        run.queue.requeue(book.requeue(victim))
        run.preemptions += 1
        if victim == slot:
          break

  def _prefill(self, params, rows, start: int, np_batch: int):
    """Prefix of prompts [start, start + np_batch) (missing rows padded with one token)."""
    toks = np.zeros((np_batch, self.engine.max_prefill_length), np.int32)
    lens = np.ones((np_batch,), np.int32)
    for j, r in enumerate(rows[start:start + np_batch]):
      toks[j, :r.size], lens[j] = r, r.size
    return self.engine.prefill_batch(params, toks, lens)


def _expert_shape(eng: Engine):
  """(P, Lm, K) of the experts an engine records, or None."""
  c = eng.cfg
  return ((eng.max_prefill_length, len(c.moe_layers), c.num_experts_per_tok)
          if eng.record_experts else None)


def _stats(cfg, run: "_SampleCall", prompt_lens, *, slots, wall) -> dict:
  """sample_groups' stats (see its docstring)."""
  gen, g = int(run.book.lengths.sum()), run.g
  return dict(
      decode_steps=run.steps, generate_calls=run.chunks,
      slot_utilisation=gen / max(run.steps * slots, 1), prefills=len(prompt_lens),
      prefill_calls=run.prefill_calls, inserts=len(prompt_lens) * g + run.preemptions,
      prefill_tokens_saved=sum(prompt_lens) * (g - 1),
      prefill_flops_saved=(g - 1) * sum(flops.prefill_flops(cfg, x) for x in prompt_lens),
      generated_tokens=gen, wall_time_s=wall, tokens_per_s=gen / wall,
      preemptions=run.preemptions, pages_peak=run.pool.in_use_peak if run.pool else 0,
      pool_peak_frac=run.pool.peak_frac() if run.pool else 0.0)


@dataclasses.dataclass
class _SampleCall:
  """The state of one sample_groups call."""
  rows: list
  g: int
  t_max: int
  offset: int
  np_batch: int
  book: book_lib.SlotBook
  pool: object                # rollout.pages.PagePool, or None for the dense cache
  queue: book_lib.SampleQueue
  st: object                  # the DecodeState
  prefix: object = None
  pb_start: int = -1
  steps: int = 0
  chunks: int = 0
  prefill_calls: int = 0
  preemptions: int = 0


def make_sampler(model, *, num_slots: int, max_prompt_len: int, max_len: int, mesh=None,
                 steps_per_call: int = 16, prefill_batch: int | None = None,
                 paged_kv: bool = False, page_size: int = 16,
                 num_pages: int | None = None, record_experts: bool = False,
                 weight_dtype: str = "auto") -> GroupSampler:
  """Fixed entry point: a GroupSampler over a new Engine for `model` (see Engine for args).

  steps_per_call: most decode steps per device call (a call also returns as soon as a sample
  ends while others wait, so this only bounds host round-trips). prefill_batch: prompts per
  prefill call (default ceil(num_slots / group_size)). paged_kv / page_size / num_pages: a
  paged KV cache (see Engine). record_experts: routing replay (see Engine, GroupRollout).
  weight_dtype: the sampler's weights (see Engine; "int8": models/quant.py).
  """
  engine = Engine(model, num_slots=num_slots, max_prompt_len=max_prompt_len, max_len=max_len,
                  mesh=mesh, steps_per_call=steps_per_call, paged_kv=paged_kv,
                  page_size=page_size, num_pages=num_pages, record_experts=record_experts,
                  weight_dtype=weight_dtype)
  return GroupSampler(engine, prefill_batch=prefill_batch)
