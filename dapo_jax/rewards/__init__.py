"""Rule-based rewards: text → (reward, correct, prediction)."""
from typing import Callable

import numpy as np

from dapo_jax.rewards import math_answer

# Swappable reward functions chosen by a config string (docs/design.md, "Conventions").
REWARD_FNS = {"math_answer": math_answer.score}


def get_reward_fn(name: str):
  if name not in REWARD_FNS:
    raise ValueError(f"reward: unknown reward function {name!r}; expected one of "
                     f"{sorted(REWARD_FNS)}")
  return REWARD_FNS[name]


def verifier_errors() -> int:
  """Parser errors caught (each scored −1) by every reward function in this process, so far.

  Cumulative: a trainer logs the difference across a step as the metric `verifier_errors`.
  """
  return math_answer.verifier_errors()


def score_responses(tokens_NxGxR, lengths_NxG, answers, *, decode: Callable,
                    reward_fn: Callable):
  """(score_NxG, correct_NxG, preds): the verifier on every response, decoded in one call.

  The one decode-then-verify path of training and evaluation; preds[n][g] is the verifier's
  extracted answer (None when it found none), which maj@k votes on.
  """
  N, G = lengths_NxG.shape
  rows = [tokens_NxGxR[n, g, :lengths_NxG[n, g]].tolist() for n in range(N) for g in range(G)]
  texts = decode(rows) if rows else []
  score = np.zeros((N, G), np.float32)
  correct = np.zeros((N, G), bool)
  preds = [[None] * G for _ in range(N)]
  for i, text in enumerate(texts):
    n, g = divmod(i, G)
    score[n, g], correct[n, g], preds[n][g] = reward_fn(text, answers[n])
  return score, correct, preds
