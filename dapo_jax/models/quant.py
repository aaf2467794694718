"""int8 weights for the sampler: per-channel symmetric quantisation of the layer projections.

A projection w (stacked over layers, [L, in..., out...]) becomes `Int8Weight(q, scale)`:
q = round(w / scale) in int8, scale = max |w| over the input (contracted) axes / 127, one per
layer and output channel, kept as [L, 1.., out...] so that `layers.dense` computes

    x @ w  ≈  (x @ q) * scale            (per output channel, exactly the algebra of q * scale)

q is converted to the activation dtype inside the matmul's operand (weight-only int8: the
activations stay bfloat16 / float32). On TPU, XLA fuses the int8 -> bf16 convert into the
matmul's operand fetch, so HBM holds and streams int8; XLA:CPU converts the block first (the
same values, no speed-up). No int8 x int8 dot is used: it would need the activations quantised
too (w8a8), another error source this module does not add.

Quantised: wq, wk, wv, wo and the dense MLP (w_gate, w_up, w_down). Kept in the compute dtype:
the embedding and LM head (a lookup and the logits' last matmul), norms, biases, MoE routers and
experts (the ragged expert matmuls take no Int8Weight: a MoE model refuses int8 rollout).
`Int8Weight` is a pytree (q, scale) and slices like an array (`w[i]`, as the layer stacks are
sliced), so scans and per-layer decode loops take it unchanged.
"""
from __future__ import annotations

import dataclasses
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec

WEIGHT_DTYPES = ("auto", "bfloat16", "float32", "int8")
QUANTIZED = {"wq": 1, "wk": 1, "wv": 1, "wo": 2, "w_gate": 1, "w_up": 1, "w_down": 1}  # in_dims


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Int8Weight:
  """q: int8 [L?, in..., out...]; scale: float32 of q's shape with the input axes 1."""
  q: jax.Array
  scale: jax.Array

  @property
  def shape(self):
    return self.q.shape

  @property
  def ndim(self):
    return self.q.ndim

  @property
  def nbytes(self):
    return self.q.nbytes + self.scale.nbytes

  def __getitem__(self, i):
    return Int8Weight(self.q[i], self.scale[i])


def quantize(w, in_dims: int, *, stacked: bool = True) -> Int8Weight:
  """w -> Int8Weight with one scale per (layer, output channel); in_dims input axes follow the
  leading layer axis when `stacked`. All-zero channels get scale 1 (q = 0)."""
  lead = 1 if stacked else 0
  axes = tuple(range(lead, lead + in_dims))
  w32 = w.astype(jnp.float32)
  amax = jnp.max(jnp.abs(w32), axis=axes, keepdims=True)
  scale = jnp.where(amax > 0, amax / 127.0, 1.0)
  q = jnp.clip(jnp.round(w32 / scale), -127, 127).astype(jnp.int8)
  return Int8Weight(q, scale)


def dense_int8(x2d, w: Int8Weight, k: int, out_dtype):
  """[N, K] activations @ an Int8Weight with K input elements -> [N, M] in out_dtype."""
  y = jnp.matmul(x2d, w.q.astype(x2d.dtype).reshape(k, -1),
                 preferred_element_type=jnp.float32)
  return (y * w.scale.reshape(1, -1)).astype(out_dtype or x2d.dtype)


def _leaf_name(path) -> str | None:
  """The Layers weight a param path names ("wq", ...), or None."""
  keys = [getattr(p, "key", getattr(p, "name", None)) for p in path]
  keys = [k for k in keys if k not in (None, "value")]
  return keys[-1] if len(keys) >= 2 and keys[-2] == "layers" else None


def storage_dtype(weight_dtype: str, compute_dtype) -> jnp.dtype:
  """The dtype the sampler's weights are placed in: the compute dtype for "auto" and "int8"
  (int8 quantises from it), else weight_dtype itself."""
  return jnp.dtype(compute_dtype if weight_dtype in ("auto", "int8") else weight_dtype)


def check_model(cfg, weight_dtype: str):
  """Refuses what int8 rollout cannot serve, before anything compiles."""
  if weight_dtype not in WEIGHT_DTYPES:
    raise ValueError(f"rollout.weight_dtype: {weight_dtype!r}; expected one of {WEIGHT_DTYPES}")
  if weight_dtype == "int8" and cfg.moe_layers:
    raise ValueError("rollout.weight_dtype: 'int8' quantises the dense projections only; this "
                     f"model has MoE layers {tuple(cfg.moe_layers)} (their ragged expert "
                     "matmuls take no int8 weights): use 'auto' or 'bfloat16'")


def quantized_shardings(shardings):
  """The param shardings with each quantised weight's leaf as Int8Weight(q's = the weight's,
  scale's = the weight's with the input axes unsharded)."""
  def one(path, s):
    name = _leaf_name(path)
    if name not in QUANTIZED:
      return s
    spec = list(s.spec) + [None] * 8
    n = len(s.spec)
    scale = PartitionSpec(spec[0], *([None] * QUANTIZED[name]), *spec[1 + QUANTIZED[name]:n])
    return Int8Weight(s, NamedSharding(s.mesh, scale))
  return jax.tree_util.tree_map_with_path(one, shardings)


def quantize_tree(params):
  """`params` (the Param state, or its pure dict) with the projections as Int8Weight."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: quantize(x, QUANTIZED[_leaf_name(path)]) if _leaf_name(path) in QUANTIZED
      else x, params)


def quantize_params(params, shardings):
  """The engine's params (an nnx.Param state on its mesh, compute dtype) with the projections
  as Int8Weight, laid out by `quantized_shardings(shardings)`: one jitted pass on the sampler's
  devices. The input copy is not kept (callers drop it)."""
  return jax.jit(quantize_tree, out_shardings=quantized_shardings(shardings))(params)


def abstract_quantized(params, shardings):
  """ShapeDtypeStructs of `quantize_params(params, shardings)` (the AOT check's sampler)."""
  out = jax.eval_shape(quantize_tree, params)
  return jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh), out,
                      quantized_shardings(shardings))


def weight_bytes(params) -> int:
  """Bytes of every array in `params` (Int8Weight counts q and scale)."""
  return sum(x.nbytes for x in jax.tree.leaves(params))

