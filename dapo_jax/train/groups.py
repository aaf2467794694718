"""Scored groups on the host: rollouts + rewards, and their layout as a training batch."""
import dataclasses
from typing import Callable, Sequence

import numpy as np

from dapo_jax import rewards
from dapo_jax.core import overlong
from dapo_jax.train.batch import MiniBatch


@dataclasses.dataclass
class Groups:
  """N groups of G responses, all host numpy arrays shaped [N, G, ...] (prompts: N lists)."""
  prompts: list            # N token-id lists
  answers: list            # N ground-truth strings
  tokens: np.ndarray       # int32 [N, G, R] response tokens, 0 after the end
  behav_logp: np.ndarray   # float32 [N, G, R] sampler log-probs
  versions: np.ndarray     # int32 [N, G, R] the policy version that drew each token (0 = pad)
  lengths: np.ndarray      # int32 [N, G] response tokens (EOS included)
  truncated: np.ndarray    # bool [N, G] hit the generation limit
  correct: np.ndarray      # bool [N, G] verifier's verdict
  parsed: np.ndarray       # bool [N, G] the verifier read an answer (the format was followed)
  score: np.ndarray        # float32 [N, G] verifier reward (±1)
  reward: np.ndarray       # float32 [N, G] shaped reward (score + overlong penalty)
  # Routing replay (model.routing_replay; else None), as the sampler recorded them, -1 = none:
  expert_ids: np.ndarray | None = None         # int16 [N, G, R, Lm, K] response tokens' experts
  prompt_expert_ids: np.ndarray | None = None  # int16 [N, P, Lm, K] prompt tokens' experts

  def __len__(self):
    return len(self.prompts)

  def select(self, idx) -> "Groups":
    idx = np.asarray(idx, dtype=np.int64)
    return Groups(prompts=[self.prompts[i] for i in idx], answers=[self.answers[i] for i in idx],
                  **{f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[idx]
                     for f in dataclasses.fields(self) if f.name not in ("prompts", "answers")})

  @staticmethod
  def concat(parts: Sequence["Groups"]) -> "Groups":
    def cat(name):
      xs = [getattr(g, name) for g in parts]
      return None if any(x is None for x in xs) else np.concatenate(xs)
    return Groups(prompts=[p for g in parts for p in g.prompts],
                  answers=[a for g in parts for a in g.answers],
                  **{f.name: cat(f.name) for f in dataclasses.fields(Groups)
                     if f.name not in ("prompts", "answers")})


def score_rollout(rollout, prompts, answers, *, decode: Callable, reward_fn: Callable,
                  overlong_penalty: bool, max_len: int, cache_len: int,
                  factor: float) -> Groups:
  """Verifier reward (+1/−1) of every response, plus Eq. 13's penalty when enabled."""
  score, correct, preds = rewards.score_responses(rollout.tokens, rollout.lengths, answers,
                                                  decode=decode, reward_fn=reward_fn)
  parsed = np.array([[p is not None for p in row] for row in preds], bool).reshape(score.shape)
  reward = score.copy()
  if overlong_penalty:
    reward += np.asarray(overlong.soft_overlong_penalty(
        rollout.lengths, max_len=max_len, cache_len=cache_len, factor=factor))
  return Groups(prompts=list(prompts), answers=list(answers),
                tokens=np.asarray(rollout.tokens, np.int32),
                behav_logp=np.asarray(rollout.logprobs, np.float32),
                versions=np.asarray(rollout.versions, np.int32),
                lengths=np.asarray(rollout.lengths, np.int32),
                truncated=np.asarray(rollout.truncated, bool), correct=correct, parsed=parsed,
                score=score, reward=reward.astype(np.float32),
                expert_ids=getattr(rollout, "expert_ids", None),
                prompt_expert_ids=getattr(rollout, "prompt_expert_ids", None))


def training_batch(groups: Groups, adv_NxG, *, seq_len: int, overlong_filter: bool
                   ) -> tuple[MiniBatch, np.ndarray]:
  """(MiniBatch, response_mask_BxS): rows [prompt][response][pad] of length seq_len, one per
  (n, g), with the sampler's log-probs as `behav_logp_BxS`, its experts (routing replay) as
  `expert_ids_BxSxLxK`, and no old log-probs or plan yet (the trainer's `prepare` adds what
  the config asks for).

  response_mask marks response tokens; the loss mask is it zeroed for truncated responses under
  overlong filtering.
  """
  N, G, R = groups.tokens.shape
  B = N * G
  plen_N = np.asarray([len(p) for p in groups.prompts], np.int64)
  total_NxG = plen_N[:, None] + groups.lengths
  if (total_NxG > seq_len).any():
    n, g = np.argwhere(total_NxG > seq_len)[0]
    raise ValueError(f"prompt {n} ({plen_N[n]} tokens) + response ({groups.lengths[n, g]}) "
                     f"exceed seq_len {seq_len}")
  # Vectorised (no per-row Python): column j of row n·G + g is prompt token j, response
  # token j − P, or padding.
  prompt_NxP = np.zeros((N, max(int(plen_N.max()), 1)), np.int32)
  prompt_NxP[np.arange(prompt_NxP.shape[1])[None, :] < plen_N[:, None]] = np.concatenate(
      [np.asarray(p, np.int32).reshape(-1) for p in groups.prompts])
  pos_BxS = np.broadcast_to(np.arange(seq_len)[None, :], (B, seq_len))
  p_Bx1 = np.repeat(plen_N, G)[:, None]
  is_prompt = pos_BxS < p_Bx1
  response_mask = ~is_prompt & (pos_BxS < p_Bx1 + groups.lengths.reshape(B, 1))
  rel_BxS = np.clip(pos_BxS - p_Bx1, 0, R - 1)
  rows_Bx1 = np.arange(B)[:, None]
  prompt_tok = prompt_NxP[rows_Bx1 // G, np.minimum(pos_BxS, prompt_NxP.shape[1] - 1)]
  resp_tok = groups.tokens.reshape(B, R)[rows_Bx1, rel_BxS]
  tokens = np.where(is_prompt, prompt_tok, np.where(response_mask, resp_tok, 0)).astype(np.int32)
  attn = (is_prompt | response_mask).astype(np.float32)
  keep = overlong.overlong_mask(groups.truncated) if overlong_filter else np.ones((N, G))
  loss_mask = (response_mask * np.asarray(keep, np.float32).reshape(B, 1)).astype(np.float32)
  behav = np.where(response_mask, groups.behav_logp.reshape(B, R)[rows_Bx1, rel_BxS],
                   0.0).astype(np.float32)
  batch = MiniBatch(tokens_BxS=tokens, attn_mask_BxS=attn, loss_mask_BxS=loss_mask,
                    adv_B=np.asarray(adv_NxG, np.float32).reshape(B), behav_logp_BxS=behav,
                    expert_ids_BxSxLxK=_row_experts(groups, is_prompt, response_mask, rel_BxS))
  return batch, response_mask


def _row_experts(groups: Groups, is_prompt_BxS, response_BxS, rel_BxS):
  """The recorded experts in the rows' layout [B, S, Lm, K] int16 (-1 on padding), or None."""
  if groups.expert_ids is None:
    return None
  n, g, r = groups.tokens.shape
  rows_Bx1 = np.arange(n * g)[:, None]
  pos_BxS = np.minimum(np.arange(is_prompt_BxS.shape[1]), groups.prompt_expert_ids.shape[1] - 1)
  prompt = groups.prompt_expert_ids[rows_Bx1 // g, pos_BxS[None, :]]
  resp = groups.expert_ids.reshape(n * g, r, *groups.expert_ids.shape[3:])[rows_Bx1, rel_BxS]
  return np.where(is_prompt_BxS[..., None, None], prompt,
                  np.where(response_BxS[..., None, None], resp, -1)).astype(np.int16)
