"""Examples -> batches of prompt token ids: a deterministic, resumable, multi-host iterator.

Step k of the run takes global batch k: epoch e = k // batches_per_epoch is a seeded permutation of
the examples (the tail that does not fill a batch is dropped, a different tail each epoch), and
batch k is the next `batch_size` indices of it. With num_shards hosts, host i gets the i-th
contiguous 1/num_shards of every global batch, so the hosts' batches, concatenated in shard order,
are exactly the one-host batch. The position is one integer (the step), so `state()` is a small
JSON dict for the checkpoint and a run can resume on a different number of hosts.

Prompts longer than max_prompt_len tokens are left-truncated (their start is cut, as the reference
does), flagged per batch and counted (the trainer logs each step's count as `prompts_truncated`;
`encode_eval_prompts` counts the held-out set's for the eval results).
"""
import dataclasses
import hashlib

import numpy as np

from dapo_jax.data.example import Example

_STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class PromptBatch:
  """One host's part of a global batch. prompt_ids are unpadded token-id lists."""
  step: int  # global batch index since the start of the run
  epoch: int
  examples: list  # list[Example]
  prompt_ids: list  # list[list[int]], after left-truncation
  lengths_B: np.ndarray  # int32 [B], len of each prompt_ids entry
  truncated_B: np.ndarray  # bool [B], the prompt was left-truncated

  @property
  def ids(self) -> list[str]:
    return [e.id for e in self.examples]

  @property
  def answers(self) -> list[str]:
    return [e.answer for e in self.examples]

  def padded(self, pad_id: int, *, length: int | None = None, side: str = "left"):
    """(tokens_BxL int32, mask_BxL bool) padded to `length` (default: the longest prompt)."""
    if side not in ("left", "right"):
      raise ValueError(f"side: expected 'left' or 'right', got {side!r}")
    longest = int(self.lengths_B.max(initial=0))
    length = longest if length is None else length
    if length < longest:
      raise ValueError(f"length: {length} is shorter than the longest prompt ({longest} tokens)")
    tokens_BxL = np.full((len(self.prompt_ids), length), pad_id, np.int32)
    mask_BxL = np.zeros((len(self.prompt_ids), length), bool)
    for b, ids in enumerate(self.prompt_ids):
      lo = length - len(ids) if side == "left" else 0
      tokens_BxL[b, lo:lo + len(ids)] = ids
      mask_BxL[b, lo:lo + len(ids)] = True
    return tokens_BxL, mask_BxL


class PromptIterator:
  """Deterministic, resumable iterator of PromptBatch over a list of Examples.

  Args:
    examples: the dataset (list[Example]); its order and ids are part of the resume check.
    tokenizer: an HF tokenizer (encode(text, add_special_tokens=...), apply_chat_template).
    batch_size: prompts per global batch (all hosts together); divisible by num_shards.
    seed: shuffling seed; epoch e uses permutation rng([seed, e]).
    max_prompt_len: tokens; longer prompts are left-truncated. None: no limit.
    shuffle: False iterates in dataset order every epoch.
    num_epochs: stop after this many epochs; None: forever.
    shard_index, num_shards: this host's part of every global batch.
    use_chat_template: wrap each prompt as one user message with the tokenizer's chat template
      (what the paper does for base models); its special tokens come from the template.
  """

  def __init__(self, examples, tokenizer, *, batch_size: int, seed: int = 0,
               max_prompt_len: int | None = None, shuffle: bool = True,
               num_epochs: int | None = None, shard_index: int = 0, num_shards: int = 1,
               use_chat_template: bool = False):
    if not examples or not all(isinstance(e, Example) for e in examples):
      raise ValueError("examples: expected a non-empty list of Example")
    _check_int("seed", seed, 0)
    _check_int("num_shards", num_shards, 1)
    _check_int("batch_size", batch_size, 1)
    if not 0 <= shard_index < num_shards:
      raise ValueError(f"shard_index: expected 0 <= shard_index < num_shards={num_shards}, "
                       f"got {shard_index}")
    if batch_size % num_shards:
      raise ValueError(f"batch_size: {batch_size} is not divisible by num_shards={num_shards}")
    if batch_size > len(examples):
      raise ValueError(f"batch_size: {batch_size} exceeds the number of examples "
                       f"({len(examples)}); no full batch can be formed")
    if max_prompt_len is not None:
      _check_int("max_prompt_len", max_prompt_len, 1)
    if num_epochs is not None:
      _check_int("num_epochs", num_epochs, 1)
    if use_chat_template:
      _require_chat_template(tokenizer)
    self._examples = list(examples)
    self._tok = tokenizer
    self._batch_size, self._seed, self._shuffle = batch_size, seed, shuffle
    self._max_prompt_len, self._num_epochs = max_prompt_len, num_epochs
    self._shard_index, self._num_shards = shard_index, num_shards
    self._chat = use_chat_template
    self.batches_per_epoch = len(self._examples) // batch_size
    self._fingerprint = hashlib.sha256(
        "\0".join(e.id for e in self._examples).encode()).hexdigest()[:16]
    self._step = 0
    self.num_prompts = 0  # prompts this host has yielded
    self.num_truncated = 0  # of which left-truncated
    self._perm_epoch, self._perm = None, None

  def __iter__(self):
    return self

  def __next__(self) -> PromptBatch:
    epoch, b = divmod(self._step, self.batches_per_epoch)
    if self._num_epochs is not None and epoch >= self._num_epochs:
      raise StopIteration
    per_host = self._batch_size // self._num_shards
    start = b * self._batch_size + self._shard_index * per_host
    idx = self._permutation(epoch)[start:start + per_host]
    examples = [self._examples[i] for i in idx]
    prompt_ids, truncated = [], []
    for e in examples:
      ids = self._encode(e.prompt)
      cut = self._max_prompt_len is not None and len(ids) > self._max_prompt_len
      prompt_ids.append(ids[len(ids) - self._max_prompt_len:] if cut else ids)
      truncated.append(cut)
    batch = PromptBatch(step=self._step, epoch=epoch, examples=examples, prompt_ids=prompt_ids,
                        lengths_B=np.array([len(p) for p in prompt_ids], np.int32),
                        truncated_B=np.array(truncated, bool))
    self._step += 1
    self.num_prompts += len(examples)
    self.num_truncated += int(sum(truncated))
    return batch

  def state(self) -> dict:
    """The position and what it is valid for, as a JSON-serialisable dict."""
    return {"version": _STATE_VERSION, "step": self._step, "seed": self._seed,
            "batch_size": self._batch_size, "shuffle": self._shuffle,
            "num_examples": len(self._examples), "fingerprint": self._fingerprint,
            "num_prompts": self.num_prompts, "num_truncated": self.num_truncated}

  def restore(self, state: dict) -> None:
    """Continues from `state()`; the dataset, seed and batch size must be the ones it came from."""
    if not isinstance(state, dict):
      raise ValueError(f"state: expected a dict from PromptIterator.state(), got "
                       f"{type(state).__name__}")
    mine = self.state()
    missing = sorted(set(mine) - set(state))
    unknown = sorted(set(state) - set(mine))
    if missing or unknown:
      raise ValueError(f"state: missing keys {missing}, unknown keys {unknown}")
    for key in ("version", "seed", "batch_size", "shuffle", "num_examples", "fingerprint"):
      if state[key] != mine[key]:
        raise ValueError(f"state: {key} is {state[key]!r} in the saved state but {mine[key]!r} "
                         "here; it belongs to a different dataset or iterator setting")
    for key in ("step", "num_prompts", "num_truncated"):
      _check_int(f"state[{key!r}]", state[key], 0)
    self._step = state["step"]
    self.num_prompts, self.num_truncated = state["num_prompts"], state["num_truncated"]

  def _permutation(self, epoch: int) -> np.ndarray:
    if self._perm_epoch != epoch:
      n = len(self._examples)
      self._perm = (np.random.default_rng([self._seed, epoch]).permutation(n) if self._shuffle
                    else np.arange(n))
      self._perm_epoch = epoch
    return self._perm

  def _encode(self, prompt: str) -> list[int]:
    return encode_prompt(self._tok, prompt, use_chat_template=self._chat)


def encode_prompt(tokenizer, prompt: str, *, use_chat_template: bool = False) -> list[int]:
  """Token ids of a prompt exactly as the policy sees it in training, sampling and evaluation
  (the tokenizer's BOS, or the chat template's own special tokens). Every path that feeds the
  policy a prompt must use this: a warm start without the BOS and RL with it shifts positions.

  With the chat template the prompt is the single user message, followed by the assistant's
  generation prompt (what verl does for DAPO-Math-17k)."""
  if use_chat_template:
    _require_chat_template(tokenizer)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)
    return list(tokenizer.encode(text, add_special_tokens=False))
  return list(tokenizer.encode(prompt, add_special_tokens=True))


def encode_eval_prompts(tokenizer, texts, *, max_prompt_len: int,
                        use_chat_template: bool = False) -> tuple[list[list[int]], int]:
  """Token ids of held-out prompts, each left-truncated to max_prompt_len tokens as in
  training, and how many were cut (reported with the eval's results)."""
  full = [encode_prompt(tokenizer, t, use_chat_template=use_chat_template) for t in texts]
  return [ids[-max_prompt_len:] for ids in full], sum(len(ids) > max_prompt_len for ids in full)


_MARK = "\u2063dapo-jax-end-of-turn-probe\u2063"  # text no template writes itself


def end_of_turn_id(tokenizer) -> int | None:
  """The special token the chat template writes right after an assistant message (ChatML's
  `<|im_end|>`, Llama 3's `<|eot_id|>`), or None if it writes no special token there.

  Found by rendering one assistant turn with a marker as its content and reading the first
  token after the marker, so it follows whatever template the tokenizer carries."""
  _require_chat_template(tokenizer)
  text = tokenizer.apply_chat_template(
      [{"role": "user", "content": "1"}, {"role": "assistant", "content": _MARK}],
      tokenize=False)
  if _MARK not in text:
    raise ValueError("task.chat_template: the tokenizer's chat template does not write the "
                     "assistant's message; its end-of-turn token cannot be found")
  after = tokenizer.encode(text.split(_MARK, 1)[1], add_special_tokens=False)
  special = set(tokenizer.all_special_ids) | {
      i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
  return int(after[0]) if after and after[0] in special else None


def stop_token_ids(tokenizer, *, use_chat_template: bool) -> tuple[int, ...]:
  """Tokens that end a sampled response: with the chat template its end-of-turn token first
  (a warm start ends its targets with it), then the tokenizer's EOS."""
  stops = []
  if use_chat_template:
    eot = end_of_turn_id(tokenizer)
    if eot is not None:
      stops.append(eot)
  if tokenizer.eos_token_id is not None and int(tokenizer.eos_token_id) not in stops:
    stops.append(int(tokenizer.eos_token_id))
  if not stops:
    raise ValueError("task.tokenizer: the tokenizer has no EOS token (and no chat-template "
                     "end-of-turn token), so a response could never end")
  return tuple(stops)


def _require_chat_template(tokenizer) -> None:
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError("task.chat_template is on but the tokenizer "
                     f"({getattr(tokenizer, 'name_or_path', '?')}) has no chat template; "
                     "turn it off or use a tokenizer with one")


def _check_int(name: str, value, lo: int) -> None:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
    raise ValueError(f"{name}: expected an int >= {lo}, got {value!r}")
