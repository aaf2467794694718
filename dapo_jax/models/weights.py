"""The decoder's parameters: initialisers and the stacked layer weights (`Layers`).

Every parameter carries its logical axis names in the `logical_axes` metadata;
`dapo_jax.sharding` maps them to mesh axes.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models import lora
from dapo_jax.models.config import ModelConfig

_DENSE_MLP = ("w_gate", "w_up", "w_down")
_MOE_MLP = ("router", "we_gate", "we_up", "we_down")


@functools.partial(jax.jit, static_argnums=(1, 2))
def _normal(key, shape, std=0.02):
  """N(0, std^2) from an RngBitGenerator stream keyed by `key`.

  XLA:CPU compiles threefry sampling ~10x slower than RngBitGenerator (seconds per distinct
  shape), and init needs no cross-version bit stability. The stream is sharding-invariant.
  """
  kd = jax.random.key_data(key).ravel().astype(jnp.uint32)
  kd = jnp.resize(jnp.concatenate([kd, kd ^ jnp.uint32(0x9E3779B9)]), (4,))
  return std * jax.random.normal(jax.random.wrap_key_data(kd, impl="rbg"), shape, jnp.float32)


def param(rngs, shape, axes, dtype, init="normal"):
  if init == "normal":
    value = _normal(rngs.params(), shape)
  elif init == "ones":
    value = jnp.ones(shape, jnp.float32)
  else:
    value = jnp.zeros(shape, jnp.float32)
  return nnx.Param(value.astype(dtype), logical_axes=axes)


class Layers(nnx.Module):
  """All decoder layers' weights, stacked on a leading layer axis: attention and norms over
  all L layers; the dense MLP over `cfg.dense_layers` and the router and experts over
  `cfg.moe_layers` (each an [L] stack when every layer is of one kind)."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    n, d = cfg.num_layers, cfg.hidden_size
    h, kv, k = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    p = functools.partial(param, rngs, dtype=jnp.dtype(cfg.param_dtype))
    self.attn_norm = p((n, d), ("layers", "norm"), init="ones")
    self.wq = p((n, d, h, k), ("layers", "embed", "heads", "head_dim"))
    self.wk = p((n, d, kv, k), ("layers", "embed", "kv_heads", "head_dim"))
    self.wv = p((n, d, kv, k), ("layers", "embed", "kv_heads", "head_dim"))
    self.wo = p((n, h, k, d), ("layers", "heads", "head_dim", "embed"))
    if cfg.attention_bias:
      self.bq = p((n, h, k), ("layers", "heads", "head_dim"), init="zeros")
      self.bk = p((n, kv, k), ("layers", "kv_heads", "head_dim"), init="zeros")
      self.bv = p((n, kv, k), ("layers", "kv_heads", "head_dim"), init="zeros")
    if cfg.qk_norm:
      self.q_norm = p((n, k), ("layers", "norm"), init="ones")
      self.k_norm = p((n, k), ("layers", "norm"), init="ones")
    self.mlp_norm = p((n, d), ("layers", "norm"), init="ones")
    nd, f = len(cfg.dense_layers), cfg.intermediate_size
    if nd:
      self.w_gate = p((nd, d, f), ("layers", "embed", "mlp"))
      self.w_up = p((nd, d, f), ("layers", "embed", "mlp"))
      self.w_down = p((nd, f, d), ("layers", "mlp", "embed"))
    nm, e, fm = len(cfg.moe_layers), cfg.num_experts, cfg.moe_intermediate_size
    if nm:
      self.router = p((nm, d, e), ("layers", "embed", "expert"))
      self.we_gate = p((nm, e, d, fm), ("layers", "expert", "embed", "mlp"))
      self.we_up = p((nm, e, d, fm), ("layers", "expert", "embed", "mlp"))
      self.we_down = p((nm, e, fm, d), ("layers", "expert", "mlp", "embed"))
    self._kinds = (cfg.dense_layers, cfg.moe_layers)

  def _stacks(self) -> dict:
    """The stacked weights by name; adapted ones as `lora.LoraWeight` (models/lora.py)."""
    return lora.wrap({name: v.get_value() for name, v in vars(self).items()
                      if isinstance(v, nnx.Param)}, self)

  def arrays(self) -> dict:
    """The stacked weights as a dict of arrays (the `xs` of the layer scan): one kind of
    layer only (a scan runs one layer body)."""
    dense, moe = self._kinds
    if dense and moe:
      raise ValueError(f"Layers.arrays: dense layers {dense} and MoE layers {moe} cannot be "
                       "scanned together; run them per layer (layer_params)")
    return self._stacks()

  def layer_params(self) -> list[dict]:
    """Each layer's weights as arrays of their own (static slices of the stacks)."""
    w = self._stacks()
    dense, moe = self._kinds
    row = {i: ("dense", j) for j, i in enumerate(dense)} | {i: ("moe", j) for j, i in
                                                            enumerate(moe)}
    out = []
    for i in range(len(dense) + len(moe)):
      kind, j = row[i]
      mlp = _DENSE_MLP if kind == "dense" else _MOE_MLP
      out.append({name: a[j] if name in mlp else a[i] for name, a in w.items()
                  if name in mlp or name not in _DENSE_MLP + _MOE_MLP})
    return out
