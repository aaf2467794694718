"""JetStream's own orchestrator (Driver + LLMOrchestrator) drives the rollout Engine.

The driver runs in a child process: JetStream's threads SIGKILL their process on any error, which
must not take pytest down with it, and the child is killed if it hangs. No network is used (the
orchestrator is called directly, not through gRPC).
"""
import json
import logging
import os
import pathlib
import subprocess
import sys

import jax
import pytest
from flax import nnx

from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout import jetstream_compat
from dapo_jax.rollout import serving
from dapo_jax.rollout.engine import Engine

REPO = pathlib.Path(__file__).resolve().parents[1]

CHILD = r"""
import asyncio, json, os
import jax, jax.numpy as jnp, numpy as np
from flax import nnx
from dapo_jax.data.tokenizer import SYNTHETIC_TOKENIZER_DIR, load_tokenizer
from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout import jetstream_compat, sampling, serving
from dapo_jax.rollout.engine import Engine

tok = load_tokenizer()
cfg = ModelConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
model = Qwen2(cfg, rngs=nnx.Rngs(0))
nnx.update(model, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x,
                               nnx.state(model, nnx.Param)))
model.lm_head.set_value(model.lm_head.get_value() * 8.0)
engine = Engine(model, num_slots=4, max_prompt_len=16, max_len=48,
                sampling_params=sampling.SamplingParams(temperature=0.0),
                tokenizer_path=str(SYNTHETIC_TOKENIZER_DIR))
driver = serving.make_driver(engine)
orchestrator = jetstream_compat.import_orchestrator()
from jetstream.core.proto import jetstream_pb2
client = orchestrator.LLMOrchestrator(driver=driver)
MAX_TOKENS = 8
id_prompts = [[20 + i, 30 + 2 * i, 40 + i][: 1 + i % 3] for i in range(6)]  # 6 > 4 slots
text_prompts = ["1+2=", "Compute 7*8"]

async def decode(request):
  ids, text = [], ""
  async for resp in client.Decode(request):
    ids.extend(resp.stream_content.samples[0].token_ids)
    text += resp.stream_content.samples[0].text
  return ids, text

async def main():
  reqs = [jetstream_pb2.DecodeRequest(max_tokens=MAX_TOKENS,
              token_content=jetstream_pb2.DecodeRequest.TokenContent(token_ids=p))
          for p in id_prompts]
  reqs += [jetstream_pb2.DecodeRequest(max_tokens=MAX_TOKENS,
               text_content=jetstream_pb2.DecodeRequest.TextContent(text=t))
           for t in text_prompts]
  try:
    return await asyncio.wait_for(asyncio.gather(*[decode(r) for r in reqs]), timeout=180)
  finally:
    driver.stop()  # while the loop is open: serving.make_driver says why

results = asyncio.run(main())

graphdef, state = nnx.split(model)
fwd = jax.jit(lambda st, x, m: nnx.merge(graphdef, st)(x, m))
def greedy(prompt, steps):
  seq = np.zeros((1, 32), np.int32); seq[0, :len(prompt)] = prompt; n = len(prompt); out = []
  for _ in range(steps):
    mask = (np.arange(32) < n)[None].astype(np.int32)
    t = int(np.argmax(np.asarray(fwd(state, jnp.asarray(seq), jnp.asarray(mask)))[0, n - 1]))
    if t == tok.eos_token_id:
      break
    seq[0, n] = t; n += 1; out.append(t)
  return out

# JetStream prepends the BOS (1) to requests without a session cache.
refs = [greedy([tok.bos_token_id] + p, MAX_TOKENS) for p in id_prompts]
refs += [greedy([tok.bos_token_id] + tok.encode(t, add_special_tokens=False), MAX_TOKENS)
         for t in text_prompts]
print("RESULT " + json.dumps({"got": [r[0] for r in results], "texts": [r[1] for r in results],
                              "refs": refs, "ref_texts": [tok.decode(r) for r in refs[-2:]]}))
"""


def test_jetstream_driver_serves_the_engine():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(REPO))
  env.pop("XLA_FLAGS", None)
  try:
    proc = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                          timeout=400, cwd=str(REPO))
  except subprocess.TimeoutExpired as e:
    pytest.fail(f"JetStream driver did not answer in time:\n{(e.stdout or '')[-3000:]}")
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
  assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-3000:],
                                          proc.stderr[-3000:])
  out = json.loads(lines[-1][len("RESULT "):])
  assert out["got"] == out["refs"]  # every request, token and text, equals greedy decoding
  assert all(len(g) > 0 for g in out["got"])
  assert out["texts"][-2:] == out["ref_texts"]


def test_compat_alias_and_quiet_import():
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  orchestrator = jetstream_compat.import_orchestrator()
  assert jax.tree_map is jax.tree.map
  # The orchestrator's delete_pytree (the call that failed on current JAX) now works.
  orchestrator.delete_pytree({"a": jax.numpy.ones(3)})
  assert root.level == level and root.handlers == handlers


def test_unservable_engines_fail_at_start_up():
  cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                    num_heads=4, num_kv_heads=2, head_dim=8)
  model = Qwen2(cfg, rngs=nnx.Rngs(0))
  odd = Engine(model, num_slots=2, max_prompt_len=24, max_len=40, bos_id=1)
  with pytest.raises(ValueError, match="max_prompt_len: JetStream's orchestrator pads"):
    serving.make_driver(odd)
  no_bos = Engine(model, num_slots=2, max_prompt_len=16, max_len=40)
  with pytest.raises(ValueError, match="bos_id"):
    serving.make_driver(no_bos)
