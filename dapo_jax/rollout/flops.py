"""Matmul FLOP counts of the policy's prefill and decode (2 FLOPs per multiply-add).

Used for the sampler's "prefill FLOPs saved by fan-out" and the benchmark's fraction of matmul
peak. Norms, rotary, softmax and the embedding lookup are left out (they are not matmuls).
"""


def matmul_params_per_token(cfg) -> int:
  """Weights one token multiplies through in the layer stack (q, k, v, o and the SwiGLU MLP)."""
  d, hd = cfg.hidden_size, cfg.head_dim
  attn = d * cfg.num_heads * hd + 2 * d * cfg.num_kv_heads * hd + cfg.num_heads * hd * d
  mlp = 3 * d * cfg.intermediate_size
  return cfg.num_layers * (attn + mlp)


def prefill_flops(cfg, n: int) -> int:
  """One causal prefill of n tokens: projections, causal QK^T and AV, LM head at the last token."""
  attn = 2 * cfg.num_layers * cfg.num_heads * cfg.head_dim * n * n  # n^2/2 pairs x 2 matmuls x 2
  return 2 * n * matmul_params_per_token(cfg) + attn + 2 * cfg.hidden_size * cfg.vocab_size


def decode_flops(cfg, context: int) -> int:
  """One decode token attending to `context` earlier tokens (itself included)."""
  attn = 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * context
  return 2 * matmul_params_per_token(cfg) + attn + 2 * cfg.hidden_size * cfg.vocab_size
