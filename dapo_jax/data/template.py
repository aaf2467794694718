"""The DAPO prompt template: the single source of its prefix and suffix.

Byte-exact to the hub release of DAPO-Math-17k (BytedTsinghua-SIA/DAPO-Math-17k) and its AIME-2024
eval parquet, which wrap every problem as PREFIX + problem + SUFFIX (see shared/data/SOURCES.md).
The reward (rewards.math_answer) reads the last "Answer:" line that this template asks for.
"""

PREFIX = (
    "Solve the following math problem step by step. The last line of your response should be of "
    "the form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n")
SUFFIX = "\n\nRemember to put your answer on its own line after \"Answer:\"."


def make_prompt(problem: str) -> str:
  """PREFIX + problem + SUFFIX, exactly as the reference builds its training prompts."""
  if not isinstance(problem, str):
    raise ValueError(f"problem: expected str, got {type(problem).__name__}")
  return PREFIX + problem + SUFFIX


def split_prompt(prompt: str) -> str | None:
  """The problem inside a templated prompt, or None when `prompt` is not PREFIX + x + SUFFIX."""
  if (len(prompt) >= len(PREFIX) + len(SUFFIX) and prompt.startswith(PREFIX)
      and prompt.endswith(SUFFIX)):
    return prompt[len(PREFIX):len(prompt) - len(SUFFIX)]
  return None
