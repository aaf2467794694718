"""JetStream tokenizer hooks (`tokenizer_api.Tokenizer`) for the rollout engine.

JetStream's orchestrator asks the engine for a tokenizer to pad requests (it prepends bos_id to
requests without a session cache) and to spot stop tokens. With an HF tokenizer directory the
engine serves text requests; without one it serves token-id requests (client-side tokenization),
and text requests fail with a clear error.
"""
from jetstream.engine import token_utils
from jetstream.engine import tokenizer_api


class TokenIdTokenizer(tokenizer_api.Tokenizer):
  """Ids only: for engines without a tokenizer (DecodeRequest.token_content requests)."""

  def __init__(self, *, bos_id: int, pad_id: int, eos_ids: tuple[int, ...]):
    self._bos, self._pad, self._eos = bos_id, pad_id, tuple(eos_ids)

  def encode(self, s, **kwargs):
    raise ValueError("text request: this engine was built without tokenizer_path; send "
                     "token_content (client-side tokenization) requests")

  def decode(self, token_ids, **kwargs):
    raise ValueError("detokenize: this engine was built without tokenizer_path; send "
                     "token_content (client-side tokenization) requests")

  @property
  def pad_id(self) -> int:
    return self._pad

  @property
  def eos_id(self) -> int:
    return self._eos[0] if self._eos else -1

  @property
  def bos_id(self) -> int:
    return self._bos

  @property
  def stop_tokens(self) -> set[int]:
    # Not the pad id: in a small vocabulary it can be an ordinary token.
    return set(self._eos)


class HFTokenizer(tokenizer_api.Tokenizer):
  """A local Hugging Face tokenizer directory, loaded with transformers.AutoTokenizer."""

  def __init__(self, path: str, *, bos_id: int | None, pad_id: int, eos_ids: tuple[int, ...]):
    from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
    self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    bos = bos_id if bos_id is not None else self._tok.bos_token_id
    if bos is None:
      raise ValueError(f"bos_id: the tokenizer at {path} has no BOS token and JetStream's "
                       "orchestrator prepends one to requests without a session_cache; pass "
                       "bos_id to the Engine")
    self._bos = int(bos)
    self._pad = int(self._tok.pad_token_id) if self._tok.pad_token_id is not None else pad_id
    stops = set(eos_ids)
    if self._tok.eos_token_id is not None:
      stops.add(int(self._tok.eos_token_id))
    self._stops = stops

  def encode(self, s, **kwargs):
    ids = self._tok.encode(s, add_special_tokens=False)
    return token_utils.pad_tokens(
        ids, self._bos, self._pad, is_bos=kwargs.pop("is_bos", True),
        prefill_lengths=kwargs.pop("prefill_lengths", None),
        max_prefill_length=kwargs.pop("max_prefill_length", None),
        jax_padding=kwargs.pop("jax_padding", True))

  def decode(self, token_ids, **kwargs):
    return self._tok.decode(list(token_ids))

  @property
  def pad_id(self) -> int:
    return self._pad

  @property
  def eos_id(self) -> int:
    return int(self._tok.eos_token_id) if self._tok.eos_token_id is not None else -1

  @property
  def bos_id(self) -> int:
    return self._bos

  @property
  def stop_tokens(self) -> set[int]:
    return set(self._stops)


def build(path: str, *, eos_ids, bos_id: int | None, pad_id: int) -> tokenizer_api.Tokenizer:
  """HFTokenizer for a non-empty path, else TokenIdTokenizer (bos_id then required)."""
  if path:
    return HFTokenizer(path, bos_id=bos_id, pad_id=pad_id, eos_ids=tuple(eos_ids))
  if bos_id is None:
    raise ValueError("bos_id: an engine without tokenizer_path needs an explicit bos_id, which "
                     "JetStream's orchestrator prepends to requests without a session_cache")
  return TokenIdTokenizer(bos_id=bos_id, pad_id=pad_id, eos_ids=tuple(eos_ids))
