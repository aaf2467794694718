"""Evaluation: avg@k, unbiased pass@k and maj@k over k samples per problem, with bootstrap CIs."""
import collections
from typing import Callable, Sequence

import numpy as np

from dapo_jax.rewards import math_answer


def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k) / C(n, k) (Chen et al. 2021)."""
  if not 0 < k <= n:
    raise ValueError(f"k: must be in [1, n={n}], got {k}")
  if not 0 <= c <= n:
    raise ValueError(f"c: must be in [0, n={n}], got {c}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(preds: Sequence[str | None], answer: str) -> bool:
  """maj@k: the most frequent (normalised) answer, ties broken by first appearance, is right."""
  keys = []
  for p in preds:
    if p is None:
      continue
    as_int = math_answer.as_integer(p)
    keys.append(as_int if as_int is not None else math_answer.normalize_string(p))
  if not keys:
    return False
  counts = collections.Counter(keys)
  best = max(counts.values())
  winner = next(k for k in keys if counts[k] == best)
  return math_answer.score(f"Answer: {winner}", answer)[1]


def bootstrap_ci(per_problem: np.ndarray, *, samples: int, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float]:
  """Percentile CI of the mean over problems, resampling problems with replacement."""
  x = np.asarray(per_problem, np.float64)
  if samples <= 0 or x.size == 0:
    return (float("nan"), float("nan"))
  rng = np.random.default_rng(seed)
  means = x[rng.integers(0, x.size, size=(samples, x.size))].mean(axis=1)
  lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
  return float(lo), float(hi)


def summarize(correct_PxK: np.ndarray, preds_PxK, answers, *, bootstrap_samples: int,
              seed: int = 0) -> dict:
  """avg@k, pass@k, maj@k (and 95 % CIs) from a problems × samples correctness matrix."""
  correct = np.asarray(correct_PxK, bool)
  P, K = correct.shape
  avg = correct.mean(axis=1)
  pk = np.array([pass_at_k(K, int(c), K) for c in correct.sum(axis=1)])
  maj = np.array([majority_correct(preds_PxK[p], answers[p]) for p in range(P)], np.float64)
  out = {"num_problems": P, "k": K}
  for name, v in ((f"avg@{K}", avg), (f"pass@{K}", pk), (f"maj@{K}", maj)):
    lo, hi = bootstrap_ci(v, samples=bootstrap_samples, seed=seed)
    out[name], out[name + "_ci_lo"], out[name + "_ci_hi"] = float(v.mean()), lo, hi
  if K >= 2:  # pass@1 from k samples equals avg@k; pass@(k/2) shows the curve's shape
    out[f"pass@{K // 2}"] = float(np.mean([pass_at_k(K, int(c), K // 2)
                                           for c in correct.sum(axis=1)]))
  return out


def evaluate(sampler, prompts: Sequence[Sequence[int]], answers: Sequence[str], *, k: int,
             temperature: float, top_p: float, max_new_tokens: int, seed: int,
             decode: Callable, reward_fn: Callable, eos_ids, bootstrap_samples: int) -> dict:
  """Samples k responses per problem with the sampler's current params and scores them."""
  rollout = sampler.sample_groups([list(p) for p in prompts], group_size=k,
                                  max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, seed=seed, eos_ids=tuple(eos_ids))
  P = len(prompts)
  correct = np.zeros((P, k), bool)
  preds = [[None] * k for _ in range(P)]
  for p in range(P):
    texts = decode([rollout.tokens[p, j, :rollout.lengths[p, j]].tolist() for j in range(k)])
    for j, t in enumerate(texts):
      _, correct[p, j], preds[p][j] = reward_fn(t, answers[p])
  out = summarize(correct, preds, answers, bootstrap_samples=bootstrap_samples, seed=seed)
  out["response_length_mean"] = float(np.mean(rollout.lengths))
  out["truncated_frac"] = float(np.mean(rollout.truncated))
  return out
