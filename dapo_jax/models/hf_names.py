"""Name and layout map between HF Qwen2/Llama/Qwen3 tensors and this model's parameters.

HF linear weights are [out, in]; ours are [in..., out...] with heads split out, e.g.
q_proj.weight [H*K, D] <-> wq [D, H, K] and o_proj.weight [D, H*K] <-> wo [H, K, D].
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

  def name(self, layer: int | None) -> str:
    return self.hf_name.format(i=layer) if self.layered else self.hf_name

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


def tensor_specs(cfg: ModelConfig) -> list[TensorSpec]:
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
          ("post_attention_layernorm.weight", "mlp_norm", False, 0),
          ("mlp.gate_proj.weight", "w_gate", True, 1),
          ("mlp.up_proj.weight", "w_up", True, 1),
          ("mlp.down_proj.weight", "w_down", True, 1)]
  s += [TensorSpec(_LAYER + hf, ("layers", ours), t, n, True) for hf, ours, t, n in lay]
  s.append(TensorSpec("model.norm.weight", ("final_norm",), False, 0, False))
  if not cfg.tie_word_embeddings:
    s.append(TensorSpec("lm_head.weight", ("lm_head",), True, 1, False))
  return s


def ignorable(name: str, cfg: ModelConfig) -> bool:
  """Checkpoint tensors that carry no parameters of ours (RoPE buffers, a tied head copy)."""
  return name.endswith("rotary_emb.inv_freq") or (
      cfg.tie_word_embeddings and name == "lm_head.weight")
