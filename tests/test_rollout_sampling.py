"""Sampling math: temperature / top-k / top-p distributions, behaviour log-probs, validation."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.rollout import sampling

# One row of logits with distinct probabilities (sorted: 5, 2, 7, 0, ...).
LOGITS_V = np.array([1.0, -0.5, 2.0, -2.0, 0.3, 3.0, -1.0, 1.5], np.float32)
N_DRAWS = 40_000


@jax.jit
def _sample_jit(logits, keys, temperature, top_p, top_k):
  return sampling.sample_tokens(logits, keys, temperature=temperature, top_p=top_p, top_k=top_k)


def _draw(*, temperature, top_p, top_k, seed=0, n=N_DRAWS):
  logits = jnp.broadcast_to(jnp.asarray(LOGITS_V)[None], (n, LOGITS_V.size))
  keys = jax.random.split(jax.random.key(seed), n)
  tok, logp = _sample_jit(logits, keys, jnp.float32(temperature), jnp.float32(top_p),
                          jnp.int32(top_k))
  return np.asarray(tok), np.asarray(logp)


def _softmax(x):
  e = np.exp(x - x.max())
  return e / e.sum()


def _expected(*, temperature, top_p, top_k):
  """Reference written independently: numpy, explicit loops over sorted tokens."""
  p = _softmax(LOGITS_V.astype(np.float64) / temperature)
  order = np.argsort(-p)
  keep = np.zeros_like(p, bool)
  k = top_k if top_k > 0 else p.size
  keep[order[:k]] = True
  q = np.where(keep, p, 0.0)
  q /= q.sum()
  mass, nucleus = 0.0, np.zeros_like(keep)
  for i in order:
    if not keep[i]:
      continue
    if mass < top_p:
      nucleus[i] = True
    mass += q[i]
  q = np.where(nucleus, q, 0.0)
  return q / q.sum()


def _assert_matches(tokens, q):
  freq = np.bincount(tokens, minlength=q.size) / tokens.size
  # Tokens outside the support never appear; inside, 5 binomial standard errors.
  assert np.all(freq[q == 0] == 0), (freq, q)
  tol = 5 * np.sqrt(q * (1 - q) / tokens.size) + 1e-4
  assert np.all(np.abs(freq - q) <= tol), (freq.round(4), q.round(4))


@pytest.mark.parametrize("temperature,top_p,top_k", [
    (1.0, 1.0, 0), (0.5, 1.0, 0), (2.0, 1.0, 0), (1.0, 1.0, 3), (1.0, 0.7, 0),
    (0.8, 0.9, 4), (1.0, 0.05, 0),
])
def test_empirical_distribution_matches_reference(temperature, top_p, top_k):
  tok, _ = _draw(temperature=temperature, top_p=top_p, top_k=top_k)
  _assert_matches(tok, _expected(temperature=temperature, top_p=top_p, top_k=top_k))


def test_temperature_moves_entropy_and_truncation_shrinks_support():
  def entropy(tok):
    f = np.bincount(tok, minlength=LOGITS_V.size) / tok.size
    f = f[f > 0]
    return -(f * np.log(f)).sum()
  cold, _ = _draw(temperature=0.3, top_p=1.0, top_k=0)
  warm, _ = _draw(temperature=1.0, top_p=1.0, top_k=0)
  hot, _ = _draw(temperature=3.0, top_p=1.0, top_k=0)
  assert entropy(cold) < entropy(warm) < entropy(hot)
  assert set(np.unique(_draw(temperature=1.0, top_p=1.0, top_k=2)[0])) == {5, 2}
  assert set(np.unique(_draw(temperature=1.0, top_p=0.5, top_k=0)[0])) <= {5, 2}


@pytest.mark.parametrize("temperature,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.8, 3)])
def test_logprob_is_full_temperature_scaled_distribution(temperature, top_p, top_k):
  tok, logp = _draw(temperature=temperature, top_p=top_p, top_k=top_k, n=64)
  full = np.log(_softmax(LOGITS_V.astype(np.float64) / temperature))
  np.testing.assert_allclose(logp, full[tok], atol=1e-5)


def test_greedy_and_per_row_keys():
  tok, logp = _draw(temperature=0.0, top_p=1.0, top_k=0, n=16)
  assert np.all(tok == np.argmax(LOGITS_V))
  np.testing.assert_allclose(logp, np.log(_softmax(LOGITS_V.astype(np.float64)))[5], atol=1e-5)
  # A row's draw depends only on its own key: same key, same token in any batch position.
  logits = jnp.broadcast_to(jnp.asarray(LOGITS_V)[None], (4, LOGITS_V.size))
  keys = jax.random.split(jax.random.key(3), 4)
  a, _ = sampling.sample_tokens(logits, keys, temperature=1.0, top_p=1.0, top_k=0)
  b, _ = sampling.sample_tokens(logits[::-1], keys[::-1], temperature=1.0, top_p=1.0, top_k=0)
  np.testing.assert_array_equal(np.asarray(a), np.asarray(b)[::-1])


def test_truncate_keeps_ties_and_at_least_one():
  x = jnp.asarray([[1.0, 1.0, 0.0, -1.0]])
  kept = np.isfinite(np.asarray(sampling.truncate_logits(x, top_p=1.0, top_k=1)))
  np.testing.assert_array_equal(kept, [[True, True, False, False]])
  kept = np.isfinite(np.asarray(sampling.truncate_logits(x, top_p=1e-6, top_k=0)))
  assert kept.sum() >= 1 and kept[0, 0]
  kept = np.isfinite(np.asarray(sampling.truncate_logits(x, top_p=1.0, top_k=99)))
  assert kept.all()


def _nucleus_reference(x_V, top_p, top_k):
  """Kept logits by the definition, float64 and a sort: the top-k set (ties at the k-th value
  kept), then each token whose strictly-more-likely mass under the renormalised top-k
  distribution is below top_p (ties at the threshold kept). Also the margin: how close the
  boundary masses come to top_p (float32 sums in another order may differ by ~1e-7)."""
  x = x_V.astype(np.float64)
  v = np.sort(x)[::-1]
  kth = v[min(top_k, x.size) - 1] if top_k > 0 else -np.inf
  q = np.where(x >= kth, np.exp(x - x.max()), 0.0)
  q /= q.sum()
  above = np.array([q[x > t].sum() for t in x])
  kept = (x >= kth) & (above < top_p)
  thr = x[kept].min()
  near = above[(x >= kth) & (above > 0)]  # a mass of 0 is exact in any order
  margin = np.abs(near - top_p).min() if top_p < 1 and near.size else np.inf
  return x >= max(thr, kth), margin


@pytest.mark.parametrize("top_p,top_k", [(0.7, 0), (0.95, 0), (1.0, 5), (0.5, 20), (0.3, 1),
                                         (1e-6, 0), (0.9, 4096)])
def test_truncate_matches_the_definition_on_wide_rows_with_ties(top_p, top_k):
  """Bisection thresholds (no sort) give the sorted definition's kept set exactly, on rows as
  wide as a vocabulary, with ties (logits rounded to bf16), +-0 and -inf entries."""
  rng = np.random.default_rng(7)
  x = rng.normal(0, 3, (24, 4096)).astype(np.float32)
  x[8:16] = x[8:16].astype(jnp.bfloat16).astype(np.float32)  # many ties
  x[16:, :64] = 0.0
  x[16:, 64:128] = -0.0
  x[20:, 128:512] = -np.inf
  got = np.isfinite(np.asarray(jax.jit(functools.partial(
      sampling.truncate_logits, top_p=top_p, top_k=top_k))(jnp.asarray(x))))
  compared = 0
  for row in range(x.shape[0]):
    want, margin = _nucleus_reference(x[row], top_p, top_k)
    if margin < 1e-5:  # a boundary the float32 sums may place either way: not a bug
      continue
    compared += 1
    np.testing.assert_array_equal(got[row], want, err_msg=f"row {row}")
  assert compared >= 20


@pytest.mark.parametrize("field,value", [
    ("temperature", -0.1), ("temperature", float("nan")), ("temperature", float("inf")),
    ("temperature", "1"), ("top_p", 0.0), ("top_p", 1.5), ("top_p", float("nan")),
    ("top_k", -1), ("top_k", 2.5), ("top_k", True), ("seed", -1), ("seed", 2**32),
    ("seed", 1.0), ("eos_ids", (64,)), ("eos_ids", (-1,)), ("eos_ids", 5),
    ("eos_ids", tuple(range(9))),
])
def test_invalid_parameters_name_the_field(field, value):
  with pytest.raises(ValueError, match=field):
    sampling.SamplingParams(**{field: value}).validated(vocab_size=64)


def test_validated_normalises_eos():
  sp = sampling.SamplingParams(eos_ids=[7, np.int64(3), 7]).validated(vocab_size=64)
  assert sp.eos_ids == (3, 7)
  np.testing.assert_array_equal(np.asarray(sp.eos_array()), [3, 7] + [-1] * 6)
