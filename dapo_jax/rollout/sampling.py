"""Temperature / top-k / top-p sampling math shared by the engine and the sampler.

Sampling parameters are traced values (not static), so changing them between calls never
recompiles. The behaviour log-prob returned with every token is taken under the full
temperature-scaled distribution (before top-k / top-p truncation): that is the distribution the
trainer recomputes with `token_logprobs(..., temperature=T)`, so the DAPO ratio π_θ / π_old
(paper Eq. 10) compares like with like. When top_p = 1 and top_k = 0 it is exactly the sampling
distribution.
"""
import dataclasses
import numbers

import jax
import jax.numpy as jnp

# Fixed width of the traced stop-token array, so a different number of EOS ids never recompiles.
MAX_EOS_IDS = 8


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """Sampling parameters of one generation call (validated against a vocabulary size).

  temperature: 0 means greedy (argmax; its log-probs are then reported at temperature 1).
  top_p: nucleus mass in (0, 1]; 1 disables it.
  top_k: keep the k most likely tokens (ties at the k-th value kept); 0 disables it.
  seed: root of every per-sample random stream, in [0, 2**32).
  eos_ids: tokens that end a sample (the EOS token is kept in the response).
  """
  temperature: float = 1.0
  top_p: float = 1.0
  top_k: int = 0
  seed: int = 0
  eos_ids: tuple[int, ...] = ()

  def validated(self, vocab_size: int) -> "SamplingParams":
    """Returns self with eos_ids as a tuple of ints; raises ValueError naming a bad field."""
    t, p, k = self.temperature, self.top_p, self.top_k
    if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t >= 0 or t == float("inf"):
      raise ValueError(f"temperature: must be a finite number >= 0 (0 = greedy), got {t!r}")
    if isinstance(p, bool) or not isinstance(p, numbers.Real) or not 0.0 < p <= 1.0:
      raise ValueError(f"top_p: must be in (0, 1], got {p!r}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 0:
      raise ValueError(f"top_k: must be an int >= 0 (0 = disabled), got {k!r}")
    s = self.seed
    if isinstance(s, bool) or not isinstance(s, numbers.Integral) or not 0 <= s < 2**32:
      raise ValueError(f"seed: must be an int in [0, 2**32), got {s!r}")
    try:
      eos = tuple(self.eos_ids)
    except TypeError:
      raise ValueError(f"eos_ids: must be a sequence of token ids, got {self.eos_ids!r}") from None
    for e in eos:
      if isinstance(e, bool) or not isinstance(e, numbers.Integral) or not 0 <= e < vocab_size:
        raise ValueError(f"eos_ids: {e!r} is not a token id in [0, {vocab_size})")
    if len(set(eos)) > MAX_EOS_IDS:
      raise ValueError(f"eos_ids: at most {MAX_EOS_IDS} distinct ids supported, got {len(set(eos))}")
    return dataclasses.replace(self, temperature=float(t), top_p=float(p), top_k=int(k),
                               seed=int(s), eos_ids=tuple(sorted({int(e) for e in eos})))

  def eos_array(self) -> jax.Array:
    """eos_ids padded with -1 to MAX_EOS_IDS (never equal to a sampled token)."""
    ids = list(self.eos_ids) + [-1] * (MAX_EOS_IDS - len(self.eos_ids))
    return jnp.asarray(ids, jnp.int32)


def truncate_logits(scaled_BxV, *, top_p, top_k):
  """Sets to -inf every logit outside the top-k set and then outside the top-p nucleus.

  Order as in HF transformers and vLLM: top-k first, then top-p on the renormalised top-k
  distribution. A token is in the nucleus when the probability mass of the tokens strictly more
  likely than it is below top_p, so the most likely token is always kept. Ties at a threshold
  are all kept. top_p / top_k may be traced scalars.

  Both cuts are thresholds on the logit, found by bisection over the logits' float order
  (`_smallest_key`, 32 masked passes over the vocabulary) instead of a sort: a sort of a
  49,152-token row costs ~16 ms on XLA:CPU, ~100x the masked passes. A cut that is not asked
  for (top_k = 0, top_p = 1) costs nothing.
  """
  key_BxV = _order_keys(scaled_BxV)
  lo_B = jnp.min(key_BxV, axis=-1) - 1  # below every key (the smallest key is -inf's, > 0)
  hi_B = jnp.max(key_BxV, axis=-1)
  k = jnp.minimum(top_k, scaled_BxV.shape[-1]).astype(jnp.int32)
  # The k-th largest logit: the smallest x with fewer than k logits above it.
  kth_B = jax.lax.cond(
      top_k > 0,
      lambda: _smallest_key(lambda x_B: jnp.sum(key_BxV > x_B[:, None], axis=-1) < k,
                            lo_B, hi_B),
      lambda: lo_B + 1)
  in_top_k = key_BxV >= kth_B[:, None]
  probs_BxV = jax.nn.softmax(jnp.where(in_top_k, scaled_BxV, -jnp.inf), axis=-1)
  # The nucleus' least likely logit: the smallest x with less than top_p mass above it.
  mass_above = lambda x_B: jnp.sum(jnp.where(key_BxV > x_B[:, None], probs_BxV, 0.0), axis=-1)
  thr_B = jax.lax.cond(
      top_p < 1.0,
      lambda: jnp.maximum(_smallest_key(lambda x_B: mass_above(x_B) < top_p, lo_B, hi_B),
                          kth_B),
      lambda: kth_B)
  return jnp.where(key_BxV >= thr_B[:, None], scaled_BxV, -jnp.inf)


def _order_keys(x):
  """float32 -> uint32 keys in the floats' order (-inf lowest, +inf highest; -0 = +0)."""
  bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, 0.0, x).astype(jnp.float32), jnp.uint32)
  return jnp.where(bits >> 31 == 1, ~bits, bits | jnp.uint32(0x80000000))


def _smallest_key(pred, lo_B, hi_B):
  """Per row, the smallest key x in (lo, hi] with pred(x), for pred monotone in x (false, then
  true) and true at hi: 32 halvings of the uint32 interval."""
  def halve(_, bounds):
    lo, hi = bounds
    mid = lo + (hi - lo) // 2
    ok = pred(mid)
    return jnp.where(ok, lo, mid), jnp.where(ok, mid, hi)
  return jax.lax.fori_loop(0, 32, halve, (lo_B, hi_B))[1]


def sample_tokens(logits_BxV, keys_B, *, temperature, top_p, top_k):
  """Draws one token per row; returns (tokens_B int32, logp_B float32).

  keys_B: typed PRNG keys, one per row (so a row's draw never depends on other rows).
  logp_B: log softmax(logits / temperature)[token], the untruncated behaviour log-prob
  (temperature 1 when greedy).
  """
  logits_BxV = logits_BxV.astype(jnp.float32)
  greedy = temperature <= 0
  scaled_BxV = logits_BxV / jnp.where(greedy, 1.0, temperature).astype(jnp.float32)
  needs_truncation = (top_p < 1.0) | (top_k > 0)
  # The threshold searches run only when a truncation is asked for.
  masked_BxV = jax.lax.cond(
      needs_truncation,
      lambda x: truncate_logits(x, top_p=top_p, top_k=top_k),
      lambda x: x,
      scaled_BxV)
  drawn_B = jax.vmap(jax.random.categorical)(keys_B, masked_BxV).astype(jnp.int32)
  tokens_B = jnp.where(greedy, jnp.argmax(logits_BxV, axis=-1).astype(jnp.int32), drawn_B)
  logp_BxV = jax.nn.log_softmax(scaled_BxV, axis=-1)
  logp_B = jnp.take_along_axis(logp_BxV, tokens_B[:, None], axis=-1)[:, 0]
  return tokens_B, logp_B
