"""Evaluation: avg@k, unbiased pass@k and maj@k over k samples per problem, with bootstrap CIs."""
import collections
from typing import Callable, Sequence

import numpy as np

from dapo_jax import rewards



def pass_at_k(n: int, c: int, k: int) -> float:
  """Unbiased pass@k from n samples with c correct: 1 − C(n−c, k) / C(n, k) (Chen et al. 2021)."""
  if not 0 < k <= n:
    raise ValueError(f"k: must be in [1, n={n}], got {k}")
  if not 0 <= c <= n:
    raise ValueError(f"c: must be in [0, n={n}], got {c}")
  if n - c < k:
    return 1.0
  return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def majority_correct(preds_k: Sequence[str | None], correct_k: Sequence[bool]) -> bool:
  """maj@k: the most frequent extracted answer (ties: first seen) is right.

  preds_k are the verifier's extracted answers (None = none found), so maj@k honours whichever
  reward function the config names; the winner is right when the verifier judged one of the
  samples that gave it correct (a verifier's verdict depends only on the extracted answer).
  """
  if len(preds_k) != len(correct_k):
    raise ValueError(f"majority_correct: {len(preds_k)} predictions vs {len(correct_k)} verdicts")
  keys = [p for p in preds_k if p is not None]
  if not keys:
    return False
  counts = collections.Counter(keys)
  best = max(counts.values())
  winner = next(p for p in keys if counts[p] == best)
  return any(bool(c) for p, c in zip(preds_k, correct_k) if p == winner)


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


def summarize(correct_Pxk: np.ndarray, preds_Pxk, *, bootstrap_samples: int,
              seed: int = 0) -> dict:
  """avg@k, pass@k, maj@k (and 95 % CIs) from a problems × samples correctness matrix."""
  correct = np.asarray(correct_Pxk, bool)
  P, k = correct.shape
  avg = correct.mean(axis=1)
  pk = np.array([pass_at_k(k, int(c), k) for c in correct.sum(axis=1)])
  maj = np.array([majority_correct(preds_Pxk[p], correct[p]) for p in range(P)], np.float64)
  out = {"num_problems": P, "k": k, "all_correct_frac": float(correct.all(axis=1).mean())}
  for name, v in ((f"avg@{k}", avg), (f"pass@{k}", pk), (f"maj@{k}", maj)):
    lo, hi = bootstrap_ci(v, samples=bootstrap_samples, seed=seed)
    out[name], out[name + "_ci_lo"], out[name + "_ci_hi"] = float(v.mean()), lo, hi
  if k >= 2:  # pass@1 from k samples equals avg@k; pass@(k/2) shows the curve's shape
    out[f"pass@{k // 2}"] = float(np.mean([pass_at_k(k, int(c), k // 2)
                                           for c in correct.sum(axis=1)]))
  return out


def evaluate(sampler, prompts: Sequence[Sequence[int]], answers: Sequence[str], *, k: int,
             temperature: float, top_p: float, max_new_tokens: int, seed: int,
             decode: Callable, reward_fn: Callable, eos_ids, bootstrap_samples: int,
             num_shown: int = 4) -> dict:
  """Samples k responses per problem with the sampler's current params and scores them.

  Besides the accuracy figures: `format_rate` (share of responses the verifier could read an
  answer from) and `shown`, the first response to each of the first `num_shown` problems,
  verbatim, for the logs.
  """
  rollout = sampler.sample_groups([list(p) for p in prompts], group_size=k,
                                  max_new_tokens=max_new_tokens, temperature=temperature,
                                  top_p=top_p, seed=seed, eos_ids=tuple(eos_ids))
  _, correct, preds = rewards.score_responses(rollout.tokens, rollout.lengths, answers,
                                              decode=decode, reward_fn=reward_fn)
  out = summarize(correct, preds, bootstrap_samples=bootstrap_samples, seed=seed)
  out["format_rate"] = float(np.mean([[p is not None for p in row] for row in preds]))
  n = min(num_shown, len(answers))
  rows = [rollout.tokens[i, 0, :rollout.lengths[i, 0]].tolist() for i in range(n)]
  texts = decode(rows) if rows else []
  out["shown"] = [{"problem": i, "answer": answers[i], "pred": preds[i][0],
                   "correct": bool(correct[i, 0]), "response": texts[i]} for i in range(n)]
  out["response_length_mean"] = float(np.mean(rollout.lengths))
  out["truncated_frac"] = float(np.mean(rollout.truncated))
  return out
