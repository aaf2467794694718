"""Serving the policy with JetStream's own orchestrator (google-jetstream 0.2.2).

`make_driver(engine)` checks the engine against what the orchestrator assumes, then starts
JetStream's Driver in interleaved mode (one engine prefills and generates, sharing params).
`jetstream.core.orchestrator.LLMOrchestrator(driver=...)` on top of it answers DecodeRequests;
`server_lib` would add gRPC (it listens on all interfaces, so tests use the orchestrator directly).
"""
from dapo_jax.rollout import jetstream_compat
from dapo_jax.rollout.engine import Engine

# JetStream pads every request to one of these lengths, capped at the engine's
# max_prefill_length, which must itself be one of them (token_utils.pad_tokens).
JETSTREAM_PREFILL_BUCKETS = tuple(2**i for i in range(4, 16))


def check_servable(engine: Engine) -> None:
  """Raises ValueError where JetStream's orchestrator would fail inside a thread (which
  SIGKILLs the process) instead of at start-up."""
  if engine.max_prefill_length not in JETSTREAM_PREFILL_BUCKETS:
    raise ValueError(f"max_prompt_len: JetStream's orchestrator pads requests to the buckets "
                     f"{JETSTREAM_PREFILL_BUCKETS} and needs max_prefill_length to be one of "
                     f"them, got {engine.max_prefill_length}")
  # Building the tokenizer here surfaces a missing bos_id or tokenizer dir now.
  engine.build_tokenizer(engine.get_tokenizer())


def make_driver(engine: Engine, *, params=None):
  """A started JetStream Driver over `engine`.

  Call .stop() inside the event loop that issued the requests, before it closes (e.g. in a
  `finally` of the coroutine `asyncio.run` drives): a stream's close reaches that loop in two
  posts from the detokenize thread, the client can finish between them, and a post to a closed
  loop raises in the thread, which JetStream answers by SIGKILLing the process."""
  check_servable(engine)
  orchestrator = jetstream_compat.import_orchestrator()
  params = engine.load_params(params)
  return orchestrator.Driver(prefill_engines=[engine], generate_engines=[engine],
                             prefill_params=[params], generate_params=[params],
                             interleaved_mode=True)
