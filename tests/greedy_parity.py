"""What the parity tests share: their right-padded batch, greedy decoding by our batched prefill
+ decode against transformers' generate, and a sampler's groups against a per-prompt greedy
reference."""
import jax.numpy as jnp
import numpy as np
import torch


def padded_batch(vocab: int):
  """(tokens [3, 12], mask) with rows of 12, 8 and 5 valid tokens, right-padded."""
  rng = np.random.RandomState(0)
  toks = rng.randint(0, vocab, (3, 12))
  mask = np.ones((3, 12), np.int64)
  mask[1, 8:] = 0
  mask[2, 5:] = 0
  return toks, mask


def greedy_tokens(prefill, decode, model, toks, lengths, steps: int) -> np.ndarray:
  """[B, steps] greedy continuations of right-padded prompts (rows at different positions)."""
  logits, cache = prefill(model, jnp.asarray(toks), jnp.asarray(lengths))
  pos, out = jnp.asarray(lengths), []
  for _ in range(steps):
    nxt = jnp.argmax(logits, axis=-1)
    out.append(nxt)
    logits, cache = decode(model, nxt, pos, cache)
    pos = pos + 1
  return np.stack(out, axis=1)


def assert_equals_hf_generate(hf_model, toks, lengths, ours: np.ndarray) -> None:
  """Each row of `ours` equals transformers' greedy generate on that prompt alone; and the
  continuations are not one repeated token."""
  steps = ours.shape[1]
  for b, n in enumerate(lengths):
    with torch.no_grad():
      out = hf_model.generate(torch.tensor(toks[b:b + 1, :n]), do_sample=False,
                              max_new_tokens=steps, min_new_tokens=steps, eos_token_id=None,
                              pad_token_id=0, attention_mask=torch.ones(1, n, dtype=int))
    np.testing.assert_array_equal(ours[b], out[0, n:].numpy())
  assert len(set(ours.ravel().tolist())) > 3  # not a degenerate constant output


def assert_groups_greedy(rollout, prompts, reference, steps: int, group_size: int) -> None:
  """Every sample of every group equals `reference(prompt, steps)` (temperature 0)."""
  for i, p in enumerate(prompts):
    ref = reference(p, steps)
    for j in range(group_size):
      np.testing.assert_array_equal(rollout.tokens[i, j], ref)
