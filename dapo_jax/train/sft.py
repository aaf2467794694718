"""Supervised warm start on reference solutions (the base model of the CPU demo).

DAPO starts from a pretrained base that can already answer in the `Answer:` format. No such model
exists offline, so the demo first fits the tiny policy to a few reference solutions of the
synthetic task: the result is a weak but format-following base that RL then improves.
"""
import functools
import random

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from dapo_jax.data.pipeline import encode_prompt
from dapo_jax.models.qwen2 import token_logprobs
from dapo_jax.train import multihost


def sequences(examples, tokenizer, *, seq_len: int, eos_id: int,
              use_chat_template: bool = False, responses=None):
  """[prompt][response][EOS] rows with a loss mask on the response and EOS tokens. With the chat
  template, eos_id is its end-of-turn token (Task.eos_ids[0]).

  The responses are the examples' reference solutions, or `responses` (texts, one per example:
  demonstrations, data/testbed.py). A reference must fit in seq_len; a demonstration longer than
  that is cut at seq_len without its EOS, as the generation limit cuts a response.
  """
  B = len(examples)
  tokens = np.zeros((B, seq_len), np.int32)
  attn = np.zeros((B, seq_len), np.float32)
  loss_mask = np.zeros((B, seq_len), np.float32)
  for i, ex in enumerate(examples):
    text = ex.solution if responses is None else responses[i]
    if text is None:
      raise ValueError(f"warm start: example {ex.id} has no reference solution")
    p = encode_prompt(tokenizer, ex.prompt, use_chat_template=use_chat_template)
    r = tokenizer.encode(text, add_special_tokens=False) + [eos_id]
    if len(p) + len(r) > seq_len:
      if responses is None or len(p) >= seq_len:
        raise ValueError(f"warm start: example {ex.id} needs {len(p) + len(r)} tokens > {seq_len}")
      r = r[:seq_len - len(p)]
    tokens[i, :len(p) + len(r)] = p + r
    attn[i, :len(p) + len(r)] = 1.0
    loss_mask[i, len(p):len(p) + len(r)] = 1.0
  return {"tokens": tokens, "attn_mask": attn, "loss_mask": loss_mask}


def _nll(params, graphdef, batch):
  model = nnx.merge(graphdef, params)
  logp, _ = token_logprobs(model, batch["tokens"], batch["attn_mask"], with_entropy=False)
  m = batch["loss_mask"]
  return -jnp.sum(logp * m) / jnp.maximum(jnp.sum(m), 1.0)


@functools.partial(jax.jit, static_argnames=("graphdef", "optimizer"), donate_argnums=(0, 1))
def _step(params, opt_state, batch, *, graphdef, optimizer):
  loss, grads = jax.value_and_grad(_nll)(params, graphdef, batch)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss


def warm_start(graphdef, params, examples, tokenizer, *, steps: int, batch_size: int, lr: float,
               seq_len: int, eos_id: int, seed: int, data_sharding=None, log_every: int = 50,
               callback=None, use_chat_template: bool = False, demo=None):
  """Fits params to `steps` batches of reference solutions; returns (params, logged losses).

  demo(example, rng) -> text, if given, writes each row's response instead (demonstrations,
  data/testbed.demo_fn). callback(step, params), if given, is called at every logging step
  (e.g. to save snapshots).
  """
  optimizer = optax.adamw(optax.warmup_cosine_decay_schedule(0.0, lr, max(steps // 10, 1), steps,
                                                             lr * 0.1), weight_decay=0.0)
  opt_state = optimizer.init(params)
  rng = np.random.default_rng(seed)
  demo_rng = random.Random(f"demo/{seed}")
  losses = []
  for step in range(steps):
    rows = [examples[i] for i in rng.choice(len(examples), size=batch_size, replace=False)]
    responses = None if demo is None else [demo(e, demo_rng) for e in rows]
    batch = sequences(rows, tokenizer, seq_len=seq_len, eos_id=eos_id,
                      use_chat_template=use_chat_template, responses=responses)
    if data_sharding is not None:
      batch = multihost.put_tree(batch, data_sharding)
    params, opt_state, loss = _step(params, opt_state, batch, graphdef=graphdef,
                                    optimizer=optimizer)
    if (step + 1) % log_every == 0 or step + 1 == steps:
      losses.append(float(loss))
      print(f"[warm start] step {step + 1}/{steps} nll {losses[-1]:.4f}", flush=True)
      if callback is not None:
        callback(step + 1, params)
  return params, losses
