"""Scored groups on the host: rollouts + rewards, and their layout as a training batch."""
import dataclasses
from typing import Callable, Sequence

import numpy as np

from dapo_jax import rewards
from dapo_jax.core import overlong


@dataclasses.dataclass
class Groups:
  """N groups of G responses, all host numpy arrays shaped [N, G, ...] (prompts: N lists)."""
  prompts: list            # N token-id lists
  answers: list            # N ground-truth strings
  tokens: np.ndarray       # int32 [N, G, R] response tokens, 0 after the end
  behav_logp: np.ndarray   # float32 [N, G, R] sampler log-probs
  lengths: np.ndarray      # int32 [N, G] response tokens (EOS included)
  truncated: np.ndarray    # bool [N, G] hit the generation limit
  correct: np.ndarray      # bool [N, G] verifier's verdict
  score: np.ndarray        # float32 [N, G] verifier reward (±1)
  reward: np.ndarray       # float32 [N, G] shaped reward (score + overlong penalty)

  def __len__(self):
    return len(self.prompts)

  def select(self, idx) -> "Groups":
    idx = np.asarray(idx, dtype=np.int64)
    return Groups(prompts=[self.prompts[i] for i in idx], answers=[self.answers[i] for i in idx],
                  **{f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)
                     if f.name not in ("prompts", "answers")})

  @staticmethod
  def concat(parts: Sequence["Groups"]) -> "Groups":
    return Groups(prompts=[p for g in parts for p in g.prompts],
                  answers=[a for g in parts for a in g.answers],
                  **{f.name: np.concatenate([getattr(g, f.name) for g in parts])
                     for f in dataclasses.fields(Groups) if f.name not in ("prompts", "answers")})


def score_rollout(rollout, prompts, answers, *, decode: Callable, reward_fn: Callable,
                  overlong_penalty: bool, max_len: int, cache_len: int,
                  factor: float) -> Groups:
  """Verifier reward (+1/−1) of every response, plus Eq. 13's penalty when enabled."""
  score, correct, _ = rewards.score_responses(rollout.tokens, rollout.lengths, answers,
                                              decode=decode, reward_fn=reward_fn)
  reward = score.copy()
  if overlong_penalty:
    reward += np.asarray(overlong.soft_overlong_penalty(
        rollout.lengths, max_len=max_len, cache_len=cache_len, factor=factor))
  return Groups(prompts=list(prompts), answers=list(answers),
                tokens=np.asarray(rollout.tokens, np.int32),
                behav_logp=np.asarray(rollout.logprobs, np.float32),
                lengths=np.asarray(rollout.lengths, np.int32),
                truncated=np.asarray(rollout.truncated, bool), correct=correct, score=score,
                reward=reward.astype(np.float32))


def training_arrays(groups: Groups, adv_NxG, *, seq_len: int, overlong_filter: bool):
  """(arrays, response_mask): rows [prompt][response][pad] of length seq_len, one per (n, g).

  response_mask marks response tokens; loss_mask is it zeroed for truncated responses under
  overlong filtering;
  old_logp holds the sampler's log-probs at the same positions (replaced by the trainer's own
  recomputation when the config says so).
  """
  N, G, R = groups.tokens.shape
  B = N * G
  tokens = np.zeros((B, seq_len), np.int32)
  attn = np.zeros((B, seq_len), np.float32)
  loss_mask = np.zeros((B, seq_len), np.float32)
  response_mask = np.zeros((B, seq_len), bool)
  old_logp = np.zeros((B, seq_len), np.float32)
  keep = overlong.overlong_mask(groups.truncated) if overlong_filter else np.ones((N, G))
  keep = np.asarray(keep, np.float32)
  for n in range(N):
    p = groups.prompts[n]
    P = len(p)
    for g in range(G):
      row, L = n * G + g, int(groups.lengths[n, g])
      if P + L > seq_len:
        raise ValueError(f"prompt {n} ({P} tokens) + response ({L}) exceed seq_len {seq_len}")
      tokens[row, :P] = p
      tokens[row, P:P + L] = groups.tokens[n, g, :L]
      attn[row, :P + L] = 1.0
      loss_mask[row, P:P + L] = keep[n, g]
      response_mask[row, P:P + L] = True
      old_logp[row, P:P + L] = groups.behav_logp[n, g, :L]
  arrays = {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask, "old_logp": old_logp,
          "adv": np.asarray(adv_NxG, np.float32).reshape(B)}
  return arrays, response_mask
