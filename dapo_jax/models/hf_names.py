"""Name and layout map between HF Qwen2/Llama/Qwen3/Qwen3-MoE tensors and our parameters.

HF linear weights are [out, in]; ours are [in..., out...] with heads split out, e.g.
q_proj.weight [H*K, D] <-> wq [D, H, K] and o_proj.weight [D, H*K] <-> wo [H, K, D].
Each spec reads one parameter (per layer when `layered`) through `load(read, has, j, shape)`
and lists its HF tensors through `export_parts`. Expert weights (`ExpertSpec`) are read in
either layout transformers has used: one tensor per expert and projection
(`mlp.experts.{e}.gate_proj.weight` [F, D], what transformers 4.x and 5.x write) or fused
per layer (`mlp.experts.gate_up_proj` [E, 2F, D], gate rows first, and `mlp.experts.down_proj`
[E, D, F]: transformers 5.x's in-memory layout); they are written per expert.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from dapo_jax.models.config import ModelConfig

_LAYER = "model.layers.{i}."


@dataclasses.dataclass(frozen=True)
class TensorSpec:
  hf_name: str  # may contain "{i}" (layer index) when `layered`
  path: tuple[str, ...]  # path in nnx.state(model)
  transpose: bool  # HF stores [out, in]
  n_in: int  # leading dims of our (per-layer) shape that form HF's flattened first dim
  layered: bool
  layer_ids: tuple[int, ...] | None = None  # HF layer of each stack entry (None: the same)

  def name(self, j: int | None) -> str:
    if not self.layered:
      return self.hf_name
    return self.hf_name.format(i=j if self.layer_ids is None else self.layer_ids[j])

  def load(self, read, has, j: int | None, ours: tuple[int, ...]) -> np.ndarray:
    """Our (per-layer) array from `read(name, hf_shape)`."""
    del has
    return self.to_ours(read(self.name(j), self.hf_shape(ours)), ours)

  def export_parts(self, shape: tuple[int, ...]) -> list:
    """(HF name, index into our array, host array -> HF array) per HF tensor."""
    if not self.layered:
      return [(self.name(None), (), self.to_hf)]
    return [(self.name(j), (j,), self.to_hf) for j in range(shape[0])]

  def hf_shape(self, ours: tuple[int, ...]) -> tuple[int, ...]:
    a, b = math.prod(ours[: self.n_in]), math.prod(ours[self.n_in:])
    if self.transpose:
      return (b, a)
    return (a, b) if self.n_in else (b,)

  def to_ours(self, x: np.ndarray, ours: tuple[int, ...]) -> np.ndarray:
    return (x.T if self.transpose else x).reshape(ours)

  def to_hf(self, x: np.ndarray) -> np.ndarray:
    ours = x.shape
    a, b = math.prod(ours[: self.n_in]), math.prod(ours[self.n_in:])
    y = x.reshape((a, b) if self.n_in else (b,))
    return np.ascontiguousarray(y.T if self.transpose else y)


@dataclasses.dataclass(frozen=True)
class ExpertSpec:
  """One expert projection of the MoE layers: ours [Lm, E, D, F] (gate, up) or [Lm, E, F, D]
  (down), HF per expert [out, in] or fused (module doc)."""
  proj: str  # "gate" | "up" | "down"
  path: tuple[str, ...]
  layer_ids: tuple[int, ...]
  layered: bool = True

  def name(self, j: int, expert: int) -> str:
    return _LAYER.format(i=self.layer_ids[j]) + f"mlp.experts.{expert}.{self.proj}_proj.weight"

  def fused_name(self, j: int) -> str:
    return _LAYER.format(i=self.layer_ids[j]) + (
        "mlp.experts.down_proj" if self.proj == "down" else "mlp.experts.gate_up_proj")

  def load(self, read, has, j: int, ours: tuple[int, ...]) -> np.ndarray:
    """Read whole (a tensor behind a URL comes as remote_safetensors.LazyTensor: `.numpy()`)."""
    e, a, b = ours
    lazy = read
    read = lambda name, shape: _eager(lazy(name, shape))  # noqa: E731
    if has(self.fused_name(j)):
      if self.proj == "down":
        x = read(self.fused_name(j), (e, b, a))
      else:
        x = read(self.fused_name(j), (e, 2 * b, a))
        x = x[:, :b] if self.proj == "gate" else x[:, b:]
      return np.ascontiguousarray(x.transpose(0, 2, 1))
    return np.stack([read(self.name(j, x), (b, a)).T for x in range(e)])

  def export_parts(self, shape: tuple[int, ...]) -> list:
    return [(self.name(j, x), (j, x), lambda y: np.ascontiguousarray(y.T))
            for j in range(shape[0]) for x in range(shape[1])]


def _eager(x) -> np.ndarray:
  return x.numpy() if hasattr(x, "numpy") else x


def _mlp_specs(cfg: ModelConfig) -> list:
  """The dense MLP over cfg.dense_layers, the router and experts over cfg.moe_layers."""
  dense, moe = cfg.dense_layers, cfg.moe_layers
  out = []
  if dense:
    out += [TensorSpec(_LAYER + f"mlp.{proj}_proj.weight", ("layers", ours), True, 1, True,
                       dense) for proj, ours in (("gate", "w_gate"), ("up", "w_up"),
                                                 ("down", "w_down"))]
  if moe:
    out.append(TensorSpec(_LAYER + "mlp.gate.weight", ("layers", "router"), True, 1, True, moe))
    out += [ExpertSpec(proj, ("layers", f"we_{proj}"), moe) for proj in ("gate", "up", "down")]
  return out


def tensor_specs(cfg: ModelConfig) -> list:
  """Every parameter of `cfg`'s model with its HF name, in HF's usual order."""
  s = [TensorSpec("model.embed_tokens.weight", ("embed",), False, 1, False)]
  lay = [("input_layernorm.weight", "attn_norm", False, 0),
         ("self_attn.q_proj.weight", "wq", True, 1),
         ("self_attn.k_proj.weight", "wk", True, 1),
         ("self_attn.v_proj.weight", "wv", True, 1)]
  if cfg.attention_bias:
    lay += [("self_attn.q_proj.bias", "bq", False, 0),
            ("self_attn.k_proj.bias", "bk", False, 0),
            ("self_attn.v_proj.bias", "bv", False, 0)]
  if cfg.qk_norm:
    lay += [("self_attn.q_norm.weight", "q_norm", False, 0),
            ("self_attn.k_norm.weight", "k_norm", False, 0)]
  lay += [("self_attn.o_proj.weight", "wo", True, 2),
          ("post_attention_layernorm.weight", "mlp_norm", False, 0)]
  s += [TensorSpec(_LAYER + hf, ("layers", ours), t, n, True) for hf, ours, t, n in lay]
  s += _mlp_specs(cfg)
  s.append(TensorSpec("model.norm.weight", ("final_norm",), False, 0, False))
  if not cfg.tie_word_embeddings:
    s.append(TensorSpec("lm_head.weight", ("lm_head",), True, 1, False))
  return s


def ignorable(name: str, cfg: ModelConfig) -> bool:
  """Checkpoint tensors that carry no parameters of ours (RoPE buffers, a tied head copy)."""
  return name.endswith("rotary_emb.inv_freq") or (
      cfg.tie_word_embeddings and name == "lm_head.weight")
