"""LoRA: low-rank adapters on the policy's projections (Hu et al., arXiv 2106.09685).

A targeted projection w [L, in..., out...] gains two trainable factors, A [L, in..., r] and
B [L, r, out...], and computes

    x @ w  +  ((x @ A) @ B) * alpha / r          (`LoraWeight`, applied by `layers.dense`)

with w frozen. A is drawn as PEFT draws it (Kaiming-uniform, bound 1/sqrt(fan_in)) and B is 0,
so a fresh adapter leaves the policy's outputs unchanged. The factors are float32 whatever the
base's dtype; they are `LoraParam`s (not `nnx.Param`s), so `nnx.split(model, LoraParam, ...)`
separates what the optimizer trains from the frozen base (`split`).

Targets use PEFT's module names (TARGETS). MoE expert weights and routers are never adapted: a
MoE layer's MLP targets are refused (`attach`), its attention projections are adapted.

Why our own delta rather than qwix (Google's JAX LoRA library): qwix adds adapters by
intercepting the matmuls of flax modules (`nnx.Linear`, `nnx.Einsum`, linen `Dense`) by module
path; this decoder keeps every layer's weights stacked on one `layers` axis and runs them
through one function (`layers.decoder_layer`) under `lax.scan`, so there is no per-projection
module for it to intercept. The delta is `LoraWeight` (a pytree that slices like the stacks)
plus one branch in `layers.dense`, and it serves the trainer, the decode loops and int8 bases.
"""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax import sharding

# PEFT module name -> (our stacked weight, its input axes after the layer axis).
TARGETS = {"q_proj": ("wq", 1), "k_proj": ("wk", 1), "v_proj": ("wv", 1), "o_proj": ("wo", 2),
           "gate_proj": ("w_gate", 1), "up_proj": ("w_up", 1), "down_proj": ("w_down", 1)}
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
RANK_AXIS = "lora_rank"  # logical name of the rank dimension (replicated: sharding rules)


class LoraParam(nnx.Variable):
  """A trainable LoRA factor (the optimizer's whole state under LoRA)."""


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LoraWeight:
  """A frozen projection w (an array or a quant.Int8Weight) with its adapter factors a, b;
  `scale` = alpha / rank. Slices like an array (`w[i]`), as the layer stacks are sliced."""
  w: object
  a: jax.Array
  b: jax.Array
  scale: float = dataclasses.field(metadata=dict(static=True))

  @property
  def shape(self):
    return self.w.shape

  @property
  def ndim(self):
    return self.w.ndim

  def __getitem__(self, i):
    return LoraWeight(self.w[i], self.a[i], self.b[i], self.scale)


def names(targets) -> tuple[str, ...]:
  """`lora.targets` ("q_proj,v_proj" or a sequence) as a tuple of PEFT module names."""
  items = targets.split(",") if isinstance(targets, str) else list(targets)
  return tuple(t.strip() for t in items if t.strip())


def has_adapters(model) -> bool:
  return bool(getattr(model.layers, "lora_targets", ()))


def attach(model, *, rank: int, alpha: float, targets, seed: int, mesh=None) -> None:
  """Adds rank-`rank` adapters to `model`'s targeted projections (built once, before the run
  splits the model). Errors name the config field: unknown targets, a rank larger than a
  projection's input or output size, MLP targets on a model whose MLPs are all MoE experts."""
  layers, cfg = model.layers, model.cfg
  targets = names(targets)
  unknown = sorted(set(targets) - set(TARGETS))
  if unknown or not targets:
    raise ValueError(f"config.lora.targets: unknown {unknown or 'empty list'}; known: "
                     f"{list(TARGETS)}")
  if has_adapters(model):
    raise ValueError("lora.attach: the model already has adapters")
  key = jax.random.key(seed)
  for t in targets:
    ours, in_dims = TARGETS[t]
    if not hasattr(layers, ours):
      raise ValueError(f"config.lora.targets: {t!r}: this model has no dense MLP "
                       f"(model.num_experts={cfg.num_experts}: MoE expert weights are not "
                       "adapted); target the attention projections q_proj,k_proj,v_proj,o_proj")
    w = getattr(layers, ours)
    shape, axes = w.get_value().shape, w.get_metadata()["logical_axes"]
    fan_in, fan_out = math.prod(shape[1:1 + in_dims]), math.prod(shape[1 + in_dims:])
    if rank > min(fan_in, fan_out):
      raise ValueError(f"config.lora.rank: {rank} exceeds {t}'s smaller dimension "
                       f"({fan_in} in, {fan_out} out); use rank <= {min(fan_in, fan_out)}")
    a_shape = (shape[0], *shape[1:1 + in_dims], rank)
    b_shape = (shape[0], rank, *shape[1 + in_dims:])
    a_axes = (*axes[:1 + in_dims], RANK_AXIS)
    b_axes = (axes[0], RANK_AXIS, *axes[1 + in_dims:])
    key, sub = jax.random.split(key)
    bound = 1.0 / math.sqrt(fan_in)
    a = _placed(lambda k=sub, s=a_shape: jax.random.uniform(k, s, jnp.float32, -bound, bound),
                a_axes, a_shape, mesh)
    b = _placed(lambda s=b_shape: jnp.zeros(s, jnp.float32), b_axes, b_shape, mesh)
    setattr(layers, f"lora_a_{ours}", LoraParam(a, logical_axes=a_axes))
    setattr(layers, f"lora_b_{ours}", LoraParam(b, logical_axes=b_axes))
  layers.lora_targets = tuple(TARGETS[t][0] for t in targets)
  layers.lora_scale = float(alpha) / rank


def _placed(make, axes, shape, mesh):
  if mesh is None:
    return make()
  out = sharding.logical_to_mesh_sharding(axes, mesh, shape=shape)
  return jax.jit(make, out_shardings=out)()


def wrap(stacks: dict, layers) -> dict:
  """The layer stacks with each adapted weight as a LoraWeight (Layers._stacks)."""
  targets = getattr(layers, "lora_targets", ())
  if not targets:
    return stacks
  out = dict(stacks)
  for name in targets:
    out[name] = LoraWeight(stacks[name], getattr(layers, f"lora_a_{name}").get_value(),
                           getattr(layers, f"lora_b_{name}").get_value(), layers.lora_scale)
  return out


def delta(lw: LoraWeight, in_dims: int):
  """scale * A @ B in w's shape (float32), stacked over the leading layer axis."""
  a, b = lw.a, lw.b
  lead, r = a.shape[0], a.shape[-1]
  d = jnp.einsum("lir,lro->lio", a.reshape(lead, -1, r), b.reshape(lead, r, -1))
  return (d * lw.scale).reshape(lw.w.shape)


def split(model):
  """(graphdef, trainable state, frozen state or None): the adapters and the rest under LoRA,
  else the whole state and None (the full-weight run's split, unchanged)."""
  if not has_adapters(model):
    graphdef, params = nnx.split(model)
    return graphdef, params, None
  return nnx.split(model, LoraParam, ...)


def join(trainable, frozen):
  """What `merge` takes: the trainable state alone (full-weight runs) or with the frozen one."""
  return trainable if frozen is None else (trainable, frozen)


def parts(params):
  """Inverse of `join`: (trainable, frozen or None)."""
  return params if isinstance(params, tuple) else (params, None)


def merge(graphdef, params):
  """The model of `join(trainable, frozen)` (nnx.merge of one or both states)."""
  trainable, frozen = parts(params)
  return nnx.merge(graphdef, trainable) if frozen is None else nnx.merge(graphdef, trainable,
                                                                         frozen)


def merged_model(model):
  """`model` without adapters, each adapted projection replaced by w + scale * A @ B in w's
  dtype: the policy as one HF checkpoint (what `hf_io.save_pretrained` writes)."""
  layers = model.layers
  stacks = wrap({n: getattr(layers, n).get_value() for n in layers.lora_targets}, layers)
  flat = dict(nnx.to_flat_state(nnx.split(model, LoraParam, ...)[2]))
  for name in layers.lora_targets:
    lw, in_dims = stacks[name], dict(TARGETS.values())[name]
    w = lw.w
    merged = (w.astype(jnp.float32) + delta(lw, in_dims)).astype(w.dtype)
    flat[("layers", name)] = flat[("layers", name)].replace(merged)
  plain = nnx.graphdef(nnx.eval_shape(lambda: type(model)(model.cfg, rngs=nnx.Rngs(0))))
  return nnx.merge(plain, nnx.from_flat_state(list(flat.items())))


@jax.jit
def _leaf_sums(leaves):
  """Per leaf: the sum of its bit patterns (as uint32) weighted by position, wrapping."""
  def one(x):
    bits = jax.lax.bitcast_convert_type(x, jnp.uint16 if x.dtype.itemsize == 2 else jnp.uint32)
    flat = bits.reshape(-1).astype(jnp.uint32)
    weight = (jnp.arange(flat.shape[0], dtype=jnp.uint32) % jnp.uint32(65521)) + 1
    return jnp.sum(flat * weight, dtype=jnp.uint32)
  return [one(x) for x in leaves]


def checksum(state) -> str:
  """A fingerprint of a (frozen base) state's values, computed where they are: sha256 of every
  leaf's position-weighted bit sum, in tree order (a changed weight changes it)."""
  import hashlib  # pylint: disable=import-outside-toplevel
  leaves = [x for x in jax.tree.leaves(state) if x.dtype.itemsize in (2, 4)]
  sums = np.asarray(jax.device_get(_leaf_sums(leaves)), np.uint32)
  return hashlib.sha256(sums.tobytes()).hexdigest()
