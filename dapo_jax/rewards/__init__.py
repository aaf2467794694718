"""Rule-based rewards: text → (reward, correct, prediction)."""
from dapo_jax.rewards import math_answer

# Swappable reward functions chosen by a config string (STYLE.md item 11).
REWARD_FNS = {"math_answer": math_answer.score}


def get_reward_fn(name: str):
  if name not in REWARD_FNS:
    raise ValueError(f"reward: unknown reward function {name!r}; expected one of "
                     f"{sorted(REWARD_FNS)}")
  return REWARD_FNS[name]
