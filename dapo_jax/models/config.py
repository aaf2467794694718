"""ModelConfig: the architecture of a Qwen2-family decoder, readable from an HF config.json."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from dapo_jax.models import hf_config
from dapo_jax.models.hf_config import ARCHITECTURES, LLAMA3_KEYS

ATTENTION_IMPLS = ("auto", "blocked", "splash", "gpu_flash", "plain")  # models/attention.py
MOE_IMPLS = ("grouped", "dense")  # models/moe.py
_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Decoder-only transformer hyper-parameters (sizes in elements, not bytes)."""
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rope_theta: float = 1e6
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  attention_bias: bool = True  # q/k/v biases (Qwen2); False for Llama/Qwen3.
  qk_norm: bool = False  # per-head RMSNorm of q and k before RoPE (Qwen3).
  rope_scaling: Mapping[str, Any] | None = None  # Llama-3 style, or None.
  max_position_embeddings: int = 32768
  dtype: str = "float32"  # compute dtype
  param_dtype: str = "float32"
  remat: bool = False  # recompute each layer's activations in the backward pass
  # Full-sequence passes: layers under lax.scan (compile time flat in depth) or unrolled
  # (faster on CPU: no per-layer weight slices or stacked-gradient updates in the backward).
  scan_layers: bool = True
  logits_chunk: int = 512  # tokens per chunk for chunked log-probs
  attention_chunk: int = 1024  # positions per attention block (full forward)
  # Training attention (models/attention.py): "auto" = splash on a TPU mesh, else blocked.
  attention_impl: str = "auto"
  architecture: str = "qwen2"  # "qwen2" | "llama" | "qwen3" | "qwen3_moe"
  # Mixture of experts (qwen3_moe; models/moe.py). 0 experts = a dense model.
  num_experts: int = 0
  num_experts_per_tok: int = 0  # k: experts each token is routed to
  moe_intermediate_size: int = 0  # channels of each expert's SwiGLU
  norm_topk_prob: bool = False  # gate weights: the top-k probabilities renormalised to sum 1
  decoder_sparse_step: int = 1  # layer i is MoE when (i + 1) % step == 0 ...
  mlp_only_layers: tuple[int, ...] = ()  # ... and i is not listed here (these are dense)
  moe_impl: str = "grouped"  # expert computation: "grouped" (ragged_dot) | "dense" (reference)

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                 "num_heads", "num_kv_heads", "head_dim", "max_position_embeddings",
                 "logits_chunk", "attention_chunk"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"ModelConfig.num_heads ({self.num_heads}) must be a multiple of "
          f"num_kv_heads ({self.num_kv_heads})")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim must be even for RoPE, got {self.head_dim}")
    if not self.rope_theta > 0:
      raise ValueError(f"ModelConfig.rope_theta must be > 0, got {self.rope_theta!r}")
    if not self.rms_norm_eps > 0:
      raise ValueError(f"ModelConfig.rms_norm_eps must be > 0, got {self.rms_norm_eps!r}")
    for name in ("dtype", "param_dtype"):
      if getattr(self, name) not in _DTYPES:
        raise ValueError(
            f"ModelConfig.{name} must be one of {_DTYPES}, got {getattr(self, name)!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl must be one of {ATTENTION_IMPLS}, "
                       f"got {self.attention_impl!r}")
    if self.architecture not in ARCHITECTURES:
      raise ValueError(
          f"ModelConfig.architecture must be one of {ARCHITECTURES}, "
          f"got {self.architecture!r}")
    for name in ("tie_word_embeddings", "attention_bias", "qk_norm", "remat", "scan_layers",
                 "norm_topk_prob"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
    # A tuple (hashable, and a later edit of the caller's list cannot change this config).
    object.__setattr__(self, "mlp_only_layers", tuple(self.mlp_only_layers))
    _check_moe(self)
    if self.rope_scaling is not None:
      _check_rope_scaling(self.rope_scaling)
      # Own copy: a later edit of the caller's dict must not change this config.
      object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))

  def __hash__(self):
    items = dataclasses.astuple(dataclasses.replace(self, rope_scaling=None))
    scaling = tuple(sorted((self.rope_scaling or {}).items()))
    return hash((items, scaling))

  @property
  def moe_layers(self) -> tuple[int, ...]:
    """Indices of the MoE layers (HF Qwen3-MoE's rule); the others have a dense MLP."""
    if not self.num_experts:
      return ()
    return tuple(i for i in range(self.num_layers) if i not in self.mlp_only_layers
                 and (i + 1) % self.decoder_sparse_step == 0)

  @property
  def dense_layers(self) -> tuple[int, ...]:
    moe = set(self.moe_layers)
    return tuple(i for i in range(self.num_layers) if i not in moe)

  @property
  def mixed_layers(self) -> bool:
    """Both dense and MoE layers: the layers then run unrolled (one scan needs one kind)."""
    return bool(self.moe_layers) and bool(self.dense_layers)

  def _attention_params(self) -> int:
    d, h, kv, hd = self.hidden_size, self.num_heads, self.num_kv_heads, self.head_dim
    attn = d * h * hd * 2 + d * kv * hd * 2 + 2 * d  # projections and the two layer norms
    if self.attention_bias:
      attn += h * hd + 2 * kv * hd
    if self.qk_norm:
      attn += 2 * hd
    return attn

  def _params(self, experts: int) -> int:
    """Parameters counting `experts` experts per MoE layer (all or the k active ones)."""
    d, n_moe = self.hidden_size, len(self.moe_layers)
    mlp = len(self.dense_layers) * 3 * d * self.intermediate_size
    moe = n_moe * (d * self.num_experts + experts * 3 * d * self.moe_intermediate_size)
    head = 0 if self.tie_word_embeddings else d * self.vocab_size
    return (self.vocab_size * d + self.num_layers * self._attention_params() + mlp + moe + d
            + head)

  @property
  def num_params(self) -> int:
    """Number of parameters (elements)."""
    return self._params(self.num_experts)

  @property
  def num_active_params(self) -> int:
    """Parameters one token uses: the router and k experts of each MoE layer (all if dense)."""
    return self._params(self.num_experts_per_tok)

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from an HF `config.json` dict (transformers 4.x or 5.x layout)."""
    kwargs = hf_config.kwargs_from_hf(d)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown ModelConfig override(s): {sorted(unknown)}")
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf_dict(self) -> dict:
    """The HF `config.json` dict that transformers loads into the same architecture."""
    return hf_config.to_hf(self)


def family_fields(num_experts: int) -> dict:
  """The family of a model built from sizes alone (no checkpoint): Qwen2 (q/k/v biases) when
  dense, Qwen3-MoE (q/k norms, no biases) with experts."""
  if not num_experts:
    return {}
  return dict(architecture="qwen3_moe", qk_norm=True, attention_bias=False)


def _check_moe(c: ModelConfig):
  """The expert fields: all zero for a dense family, consistent for qwen3_moe."""
  if c.moe_impl not in MOE_IMPLS:
    raise ValueError(f"ModelConfig.moe_impl must be one of {MOE_IMPLS}, got {c.moe_impl!r}")
  moe = c.architecture == "qwen3_moe"
  if not moe:
    if c.num_experts:
      raise ValueError(f"ModelConfig.num_experts={c.num_experts}: experts need "
                       f"architecture='qwen3_moe', got {c.architecture!r}")
    return
  for name in ("num_experts", "num_experts_per_tok", "moe_intermediate_size",
               "decoder_sparse_step"):
    value = getattr(c, name)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
      raise ValueError(f"ModelConfig.{name} must be a positive int for qwen3_moe, got {value!r}")
  if c.num_experts_per_tok > c.num_experts:
    raise ValueError(f"ModelConfig.num_experts_per_tok ({c.num_experts_per_tok}) must be <= "
                     f"num_experts ({c.num_experts})")
  bad = [i for i in c.mlp_only_layers if not 0 <= i < c.num_layers]
  if bad:
    raise ValueError(f"ModelConfig.mlp_only_layers: {bad} not in [0, {c.num_layers})")


def _check_rope_scaling(s: Mapping[str, Any]):
  rope_type = s.get("rope_type", s.get("type"))
  if rope_type != "llama3":
    raise ValueError(f"ModelConfig.rope_scaling: only rope_type 'llama3' is supported, "
                     f"got {rope_type!r}")
  missing = [k for k in LLAMA3_KEYS if k not in s]
  if missing:
    raise ValueError(f"ModelConfig.rope_scaling is missing {missing}")
  if not s["high_freq_factor"] > s["low_freq_factor"]:
    raise ValueError("ModelConfig.rope_scaling: high_freq_factor must exceed low_freq_factor")
