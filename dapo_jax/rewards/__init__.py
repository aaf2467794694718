"""Rule-based rewards: text → (reward, correct, prediction)."""
from dapo_jax.rewards import math_answer

# Swappable reward functions chosen by a config string (STYLE.md item 11).
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
