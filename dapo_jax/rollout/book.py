"""Host bookkeeping of one `GroupSampler.sample_groups` call: the queue of samples waiting for
a decode slot, and the book of which sample each slot holds and what it has produced."""
import numpy as np


class SampleQueue:
  """Samples waiting for a slot: preempted ones (lowest first), then [next, total)."""

  def __init__(self, total: int):
    self.next, self.total, self.back = 0, total, []

  def pending(self) -> bool:
    return bool(self.back) or self.next < self.total

  def peek(self, k: int) -> np.ndarray:
    head = sorted(self.back)[:k]
    return np.asarray(head + list(range(self.next, min(self.total, self.next + k - len(head)))),
                      np.int64)

  def take(self, k: int) -> None:
    self.back = sorted(self.back)
    k_back = min(k, len(self.back))
    self.back, self.next = self.back[k_back:], self.next + k - k_back

  def requeue(self, sample: int) -> None:
    self.back.append(int(sample))


class SlotBook:
  """Host bookkeeping of one sample_groups call: which sample each slot holds, and the outputs
  (tokens, behaviour log-probs, the policy version that drew each token, and with
  `experts` = (prompt length P, MoE layers Lm, K) each token's experts, -1 where none)."""

  def __init__(self, *, n: int, g: int, t_max: int, slots: int, eos: tuple[int, ...],
               experts: tuple[int, int, int] | None = None):
    self.g, self.eos = g, np.asarray(eos, np.int64)
    self.experts = self.prompt_experts = None
    if experts is not None:  # int16 as the engine records them
      p, lm, k = experts
      self.experts = np.full((n, g, t_max, lm, k), -1, np.int16)
      self.prompt_experts = np.full((n, p, lm, k), -1, np.int16)
    self.tokens = np.zeros((n, g, t_max), np.int32)
    self.logprobs = np.zeros((n, g, t_max), np.float32)
    self.versions = np.zeros((n, g, t_max), np.int32)
    self.lengths = np.zeros((n, g), np.int32)
    self.truncated = np.zeros((n, g), bool)
    self.owner = np.full((slots,), -1, np.int64)  # flat sample id (prompt * G + sample) or -1
    self.admitted = np.zeros((slots,), np.int64)  # admission order of the slot's sample
    self.count = 0
    self.received = np.zeros((slots,), np.int64)  # tokens already copied out of the slot
    self.free = list(range(slots))  # lowest slot first

  def record_prompts(self, start: int, ids_NpxPxLxK: np.ndarray) -> None:
    """The experts of prompts [start, start + Np)'s tokens, from their prefix."""
    n = min(ids_NpxPxLxK.shape[0], self.prompt_experts.shape[0] - start)
    self.prompt_experts[start:start + n] = ids_NpxPxLxK[:n]

  def busy(self) -> bool:
    return bool((self.owner >= 0).any())

  def assign(self, ids: np.ndarray) -> list[int]:
    slots, self.free = self.free[:ids.size], self.free[ids.size:]
    self.owner[slots], self.received[slots] = ids, 0
    self.admitted[slots] = self.count + np.arange(ids.size)
    self.count += ids.size
    return slots

  def requeue(self, slot: int) -> int:
    """Frees a preempted sample's slot (its tokens are drawn again); returns the sample."""
    sample = int(self.owner[slot])
    self.owner[slot], self.received[slot] = -1, 0
    self.free = sorted(self.free + [slot])
    return sample

  def record_chunk(self, out: dict, version: int) -> list:
    """Copies a chunk's new tokens, drawn by policy `version`, out of the live slots
    (vectorised); frees finished slots and returns them."""
    live = np.nonzero(self.owner >= 0)[0]
    now = out["gen_len_B"][live].astype(np.int64)
    got = self.received[live]
    pi, gi = np.divmod(self.owner[live], self.g)
    c_max = out["tokens_BxC"].shape[1]
    r, c = np.nonzero(np.arange(c_max)[None, :] < (now - got)[:, None])
    self.tokens[pi[r], gi[r], got[r] + c] = out["tokens_BxC"][live[r], c]
    self.logprobs[pi[r], gi[r], got[r] + c] = out["logp_BxC"][live[r], c]
    self.versions[pi[r], gi[r], got[r] + c] = version
    if self.experts is not None:
      self.experts[pi[r], gi[r], got[r] + c] = out["experts_BxCxLxK"][live[r], c]
    self.received[live] = now
    done = ~out["active_B"][live]
    dp, dg, dn = pi[done], gi[done], now[done]
    self.lengths[dp, dg] = dn
    self.truncated[dp, dg] = ~np.isin(self.tokens[dp, dg, dn - 1], self.eos)
    self.owner[live[done]] = -1
    self.free = sorted(self.free + live[done].tolist())
    return live[done].tolist()
