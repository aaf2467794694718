"""Masked statistics, chunked token entropy, and KL estimators for the optional KL term."""
import jax
import jax.numpy as jnp

from dapo_jax.core._checks import check_array, check_same_shape

KL_KINDS = ("k1", "k2", "k3")


def masked_mean(x, mask, axis=None):
  """Mean of x over entries where mask is non-zero; 0 (not NaN) where the mask is empty."""
  m = mask.astype(jnp.promote_types(x.dtype, jnp.float32))
  total = jnp.sum(x * m, axis=axis)
  count = jnp.sum(m, axis=axis)
  return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 0.0)


def masked_var(x, mask, *, ddof: int = 0):
  mean = masked_mean(x, mask)
  m = mask.astype(jnp.promote_types(x.dtype, jnp.float32))
  count = jnp.sum(m)
  return jnp.sum(jnp.square(x - mean) * m) / jnp.maximum(count - ddof, 1.0)


def _entropy_f32(logits):
  logits = logits.astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def entropy_from_logits(logits_BxTxV, *, chunk_size: int = 256):
  """Per-token entropy [B, T] of softmax(logits), upcasting to float32 one chunk of T at a time.

  Logits stored in bfloat16 stay so; only a [B, chunk, V] float32 slice exists at once.
  """
  check_array(logits_BxTxV, "logits_BxTxV", ndim=3, kind="float")
  if chunk_size <= 0:
    raise ValueError(f"chunk_size: must be > 0, got {chunk_size}")
  B, T, V = logits_BxTxV.shape
  if T <= chunk_size:
    return _entropy_f32(logits_BxTxV)
  n_chunks = -(-T // chunk_size)
  pad = n_chunks * chunk_size - T
  x = jnp.pad(logits_BxTxV, ((0, 0), (0, pad), (0, 0)))

  def body(i, out_BxT):
    # Slicing the stored logits inside the loop keeps the float32 upcast per chunk.
    chunk = jax.lax.dynamic_slice_in_dim(x, i * chunk_size, chunk_size, axis=1)
    return jax.lax.dynamic_update_slice_in_dim(out_BxT, _entropy_f32(chunk), i * chunk_size,
                                               axis=1)

  out = jax.lax.fori_loop(0, n_chunks, body, jnp.zeros((B, n_chunks * chunk_size), jnp.float32))
  return out[:, :T]


def kl_estimate(logp_BxT, ref_logp_BxT, *, kind: str = "k3"):
  """Per-token estimators of KL(π_θ || π_ref) from samples of π_θ (Schulman's k1 / k2 / k3).

  k1 = log π − log π_ref; k2 = ½ (log π − log π_ref)²; k3 = exp(δ) − δ − 1 with δ = log π_ref −
  log π, clamped to [−10, 10] like the reference's low-variance KL.
  """
  check_array(logp_BxT, "logp_BxT", ndim=2, kind="float")
  check_array(ref_logp_BxT, "ref_logp_BxT", ndim=2, kind="float")
  check_same_shape(logp_BxT, ref_logp_BxT, "logp_BxT", "ref_logp_BxT")
  if kind not in KL_KINDS:
    raise ValueError(f"kind: unknown KL estimator {kind!r}; expected one of {KL_KINDS}")
  log_ratio = logp_BxT - ref_logp_BxT
  if kind == "k1":
    return log_ratio
  if kind == "k2":
    return 0.5 * jnp.square(log_ratio)
  delta = -log_ratio
  return jnp.clip(jnp.exp(delta) - delta - 1.0, -10.0, 10.0)
