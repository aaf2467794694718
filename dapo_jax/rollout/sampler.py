"""Group sampler: G samples per prompt with prefix fan-out and continuous batching.

Each prompt is prefilled once and its prefix inserted into the G slots of its samples (a peer
prefills every sample, wasting G - 1 prefills per prompt). Samples are queued in (prompt, sample)
order; when one ends (EOS or its length budget) its slot takes the next queued sample before the
next decode step (an Orca-style scheduler: the long tail of one group overlaps with new work).
Every sample draws token t with the key fold_in(fold_in(fold_in(seed, prompt), sample), t), so
results do not depend on which slot runs a sample or when it finishes.
"""
import dataclasses
import math
import numbers
import time

import jax
import numpy as np

from dapo_jax.rollout import flops
from dapo_jax.rollout import sampling
from dapo_jax.rollout.engine import Engine


@dataclasses.dataclass
class GroupRollout:
  """Samples of N prompts x G, right-padded to T = max_new_tokens (numpy, host).

  tokens: int32 [N, G, T], 0 after the end. logprobs: float32 [N, G, T], behaviour log-prob of
  each token under the full temperature-scaled distribution, 0 on padding. lengths: int32 [N, G],
  EOS included when produced. truncated: bool [N, G], stopped by max_new_tokens or max_len
  without EOS. stats: scheduler figures (see GroupSampler.sample_groups).
  """
  tokens: np.ndarray
  logprobs: np.ndarray
  lengths: np.ndarray
  truncated: np.ndarray
  stats: dict

  @property
  def mask(self) -> np.ndarray:
    """bool [N, G, T]: True on response tokens."""
    t = self.tokens.shape[-1]
    return np.arange(t)[None, None, :] < self.lengths[:, :, None]


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
    self._prefill_batch = (None if prefill_batch is None
                           else _int_arg(prefill_batch, "prefill_batch", 1))

  def update_params(self, params) -> None:
    """Weight sync: the trainer's nnx.Param state (any mesh, any processes) moved
    device-to-device onto the sampler's mesh in its dtype; the old copy is freed first."""
    self.engine.load_params(params, free_old=True)

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
                    eos_ids=(), prompt_offset: int = 0) -> GroupRollout:
    """Samples group_size responses for every prompt (a list of token-id lists).

    prompt_offset: index of the first prompt in the RNG fold (a host sampling prompts
    [o, o + n) of a larger batch draws the same samples as one host sampling the whole batch).

    stats: decode_steps (batched decode steps run), generate_calls (device calls of up to
    steps_per_call steps), slot_utilisation (generated tokens / (decode_steps x slots)),
    prefills (prompts prefilled: one each), prefill_calls, inserts (samples put into slots),
    prefill_tokens_saved and prefill_flops_saved (what prefilling every sample separately would
    have added), generated_tokens, wall_time_s, tokens_per_s.
    """
    eng, t0 = self.engine, time.perf_counter()
    g, t_max, offset = self._check_counts(group_size, max_new_tokens, prompt_offset)
    sp = sampling.SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed,
                                 eos_ids=eos_ids).validated(eng.cfg.vocab_size)
    rows = self._check_prompts(prompts)
    n, b = len(rows), eng.max_concurrent_decodes
    np_batch = self._prefill_batch or min(math.ceil(b / g), n)
    book = _Book(n=n, g=g, t_max=t_max, slots=b, eos=sp.eos_ids)
    params = eng.params
    st = eng.init_decode_state(sp)
    prefix, pb_start = None, -1
    next_sample, total = 0, n * g  # samples are queued in (prompt, sample) order
    steps = prefill_calls = chunks = 0
    while True:
      while book.free and next_sample < total:  # refill every free slot before the next step
        if prefix is None or not pb_start <= next_sample // g < pb_start + np_batch:
          pb_start = next_sample // g
          prefix = self._prefill(params, rows, pb_start, np_batch)
          prefill_calls += 1
        stop = min(total, (pb_start + np_batch) * g, next_sample + len(book.free))
        ids = np.arange(next_sample, stop)
        st = eng.insert_many(prefix, st, src=ids // g - pb_start, slots=book.assign(ids),
                             prompt_ids=ids // g + offset, sample_ids=ids % g,
                             max_new=np.full(ids.shape, t_max))
        next_sample = stop
      if not book.busy():
        break
      st, out = eng.generate_chunk(params, st, stop_on_finish=next_sample < total)
      out = jax.device_get(out)
      chunks += 1
      steps += int(out["steps"])
      book.collect(out)

    stats = _stats(eng.cfg, book, [r.size for r in rows], g=g, slots=b, steps=steps,
                   chunks=chunks, prefill_calls=prefill_calls, wall=time.perf_counter() - t0)
    return GroupRollout(tokens=book.tokens, logprobs=book.logprobs, lengths=book.lengths,
                        truncated=book.truncated, stats=stats)

  def _prefill(self, params, rows, start: int, np_batch: int):
    """Prefix of prompts [start, start + np_batch) (missing rows padded with one token)."""
    toks = np.zeros((np_batch, self.engine.max_prefill_length), np.int32)
    lens = np.ones((np_batch,), np.int32)
    for j, r in enumerate(rows[start:start + np_batch]):
      toks[j, :r.size], lens[j] = r, r.size
    return self.engine.prefill_batch(params, toks, lens)


def _stats(cfg, book, prompt_lens, *, g, slots, steps, chunks, prefill_calls, wall) -> dict:
  """sample_groups' stats (see its docstring)."""
  gen = int(book.lengths.sum())
  return dict(
      decode_steps=steps, generate_calls=chunks, slot_utilisation=gen / max(steps * slots, 1),
      prefills=len(prompt_lens), prefill_calls=prefill_calls, inserts=len(prompt_lens) * g,
      prefill_tokens_saved=sum(prompt_lens) * (g - 1),
      prefill_flops_saved=(g - 1) * sum(flops.prefill_flops(cfg, x) for x in prompt_lens),
      generated_tokens=gen, wall_time_s=wall, tokens_per_s=gen / wall)


class _Book:
  """Host bookkeeping of one sample_groups call: which sample each slot holds, and the outputs."""

  def __init__(self, *, n: int, g: int, t_max: int, slots: int, eos: tuple[int, ...]):
    self.g, self.eos = g, np.asarray(eos, np.int64)
    self.tokens = np.zeros((n, g, t_max), np.int32)
    self.logprobs = np.zeros((n, g, t_max), np.float32)
    self.lengths = np.zeros((n, g), np.int32)
    self.truncated = np.zeros((n, g), bool)
    self.owner = np.full((slots,), -1, np.int64)  # flat sample id (prompt * G + sample) or -1
    self.received = np.zeros((slots,), np.int64)  # tokens already copied out of the slot
    self.free = list(range(slots))  # lowest slot first

  def busy(self) -> bool:
    return bool((self.owner >= 0).any())

  def assign(self, ids: np.ndarray) -> list[int]:
    slots, self.free = self.free[:ids.size], self.free[ids.size:]
    self.owner[slots], self.received[slots] = ids, 0
    return slots

  def collect(self, out: dict) -> None:
    """Copies a chunk's new tokens out of the live slots (vectorised); frees finished slots."""
    live = np.nonzero(self.owner >= 0)[0]
    now = out["gen_len_B"][live].astype(np.int64)
    got = self.received[live]
    pi, gi = np.divmod(self.owner[live], self.g)
    k_max = out["tokens_BxK"].shape[1]
    r, k = np.nonzero(np.arange(k_max)[None, :] < (now - got)[:, None])
    self.tokens[pi[r], gi[r], got[r] + k] = out["tokens_BxK"][live[r], k]
    self.logprobs[pi[r], gi[r], got[r] + k] = out["logp_BxK"][live[r], k]
    self.received[live] = now
    done = ~out["active_B"][live]
    dp, dg, dn = pi[done], gi[done], now[done]
    self.lengths[dp, dg] = dn
    self.truncated[dp, dg] = ~np.isin(self.tokens[dp, dg, dn - 1], self.eos)
    self.owner[live[done]] = -1
    self.free = sorted(self.free + live[done].tolist())


def make_sampler(model, *, num_slots: int, max_prompt_len: int, max_len: int, mesh=None,
                 steps_per_call: int = 16, prefill_batch: int | None = None) -> GroupSampler:
  """Fixed entry point: a GroupSampler over a new Engine for `model` (see Engine for args).

  steps_per_call: most decode steps per device call (a call also returns as soon as a sample
  ends while others wait, so this only bounds host round-trips). prefill_batch: prompts per
  prefill call (default ceil(num_slots / group_size)).
  """
  engine = Engine(model, num_slots=num_slots, max_prompt_len=max_prompt_len, max_len=max_len,
                  mesh=mesh, steps_per_call=steps_per_call)
  return GroupSampler(engine, prefill_batch=prefill_batch)
