"""ModelConfig: the architecture of a Qwen2-family decoder, readable from an HF config.json."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

ARCHITECTURES = ("qwen2", "llama", "qwen3")
ATTENTION_IMPLS = ("auto", "blocked", "splash", "gpu_flash", "plain")  # models/attention.py
_HF_ARCH_NAMES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
_DTYPES = ("float32", "bfloat16", "float16")
_LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
                "original_max_position_embeddings")


def _check_supported(d: Mapping[str, Any]) -> str:
  """The config's model_type, or a ValueError naming the unsupported setting."""
  model_type = d.get("model_type")
  if model_type not in ARCHITECTURES:
    raise ValueError(
        f"unsupported architecture: config model_type={model_type!r} "
        f"(architectures={d.get('architectures')!r}); supported: {ARCHITECTURES}")
  act = d.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"unsupported hidden_act={act!r} in config (only 'silu')")
  if d.get("mlp_bias", False):
    raise ValueError("unsupported mlp_bias=True in config")
  if d.get("use_sliding_window", False):
    raise ValueError("unsupported use_sliding_window=True in config (full attention only)")
  return model_type


def _rope_from_hf(d: Mapping[str, Any]) -> tuple[float, dict | None]:
  """(rope theta, llama3 scaling dict or None) from either transformers layout."""
  rope = dict(d.get("rope_parameters") or {})
  if d.get("rope_scaling"):  # transformers 4.x layout
    rope.update(d["rope_scaling"])
  theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
  rope_type = rope.get("rope_type", rope.get("type", "default"))
  if rope.get("partial_rotary_factor", 1.0) != 1.0:
    raise ValueError("unsupported partial_rotary_factor != 1 in config")
  if rope_type == "default":
    return float(theta), None
  if rope_type != "llama3":
    raise ValueError(f"unsupported rope_type={rope_type!r} in config "
                     "(supported: 'default', 'llama3')")
  scaling = {k: rope[k] for k in _LLAMA3_KEYS if k in rope}
  scaling.setdefault("original_max_position_embeddings", d.get("max_position_embeddings", 32768))
  scaling["rope_type"] = "llama3"
  return float(theta), scaling


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
  architecture: str = "qwen2"  # "qwen2" | "llama" | "qwen3"

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
    for name in ("tie_word_embeddings", "attention_bias", "qk_norm", "remat", "scan_layers"):
      if not isinstance(getattr(self, name), bool):
        raise ValueError(f"ModelConfig.{name} must be a bool, got {getattr(self, name)!r}")
    if self.rope_scaling is not None:
      _check_rope_scaling(self.rope_scaling)
      # Own copy: a later edit of the caller's dict must not change this config.
      object.__setattr__(self, "rope_scaling", dict(self.rope_scaling))

  def __hash__(self):
    items = dataclasses.astuple(dataclasses.replace(self, rope_scaling=None))
    scaling = tuple(sorted((self.rope_scaling or {}).items()))
    return hash((items, scaling))

  @property
  def num_params(self) -> int:
    """Number of parameters (elements)."""
    d, f, h, kv, hd = (self.hidden_size, self.intermediate_size, self.num_heads,
                       self.num_kv_heads, self.head_dim)
    attn = d * h * hd * 2 + d * kv * hd * 2
    if self.attention_bias:
      attn += h * hd + 2 * kv * hd
    if self.qk_norm:
      attn += 2 * hd
    layer = attn + 3 * d * f + 2 * d
    head = 0 if self.tie_word_embeddings else d * self.vocab_size
    return self.vocab_size * d + self.num_layers * layer + d + head

  @classmethod
  def from_hf_dict(cls, d: Mapping[str, Any], **overrides) -> "ModelConfig":
    """Builds a config from an HF `config.json` dict (transformers 4.x or 5.x layout)."""
    model_type = _check_supported(d)
    theta, scaling = _rope_from_hf(d)
    heads = d["num_attention_heads"]
    kwargs = dict(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
        num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // heads,
        rope_theta=float(theta), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3", rope_scaling=scaling,
        max_position_embeddings=d.get("max_position_embeddings", 32768),
        architecture=model_type)
    unknown = set(overrides) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
      raise ValueError(f"unknown ModelConfig override(s): {sorted(unknown)}")
    kwargs.update(overrides)
    return cls(**kwargs)

  def to_hf_dict(self) -> dict:
    """The HF `config.json` dict that transformers loads into the same architecture."""
    rope = {"rope_theta": self.rope_theta, "rope_type": "default"}
    if self.rope_scaling:
      rope.update(self.rope_scaling)
    d = {
        "architectures": [_HF_ARCH_NAMES[self.architecture]],
        "model_type": self.architecture,
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "hidden_act": "silu", "rms_norm_eps": self.rms_norm_eps,
        "max_position_embeddings": self.max_position_embeddings,
        "tie_word_embeddings": self.tie_word_embeddings,
        "rope_parameters": rope, "rope_theta": self.rope_theta,
        "dtype": self.param_dtype, "torch_dtype": self.param_dtype,
        "use_cache": True,
    }
    if self.architecture != "qwen2":
      d["attention_bias"] = self.attention_bias
    elif not self.attention_bias:
      raise ValueError("Qwen2 checkpoints always have q/k/v biases; "
                       "ModelConfig.attention_bias=False cannot be exported as qwen2")
    if self.architecture == "qwen3" and not self.qk_norm:
      raise ValueError("Qwen3 checkpoints always have q/k norms; qk_norm=False cannot be "
                       "exported as qwen3")
    if self.architecture != "qwen3" and self.qk_norm:
      raise ValueError(f"qk_norm=True cannot be exported as {self.architecture}")
    if self.architecture == "llama":
      d["mlp_bias"] = False
    if self.rope_scaling:
      d["rope_scaling"] = dict(self.rope_scaling)
    return d


def _check_rope_scaling(s: Mapping[str, Any]):
  rope_type = s.get("rope_type", s.get("type"))
  if rope_type != "llama3":
    raise ValueError(f"ModelConfig.rope_scaling: only rope_type 'llama3' is supported, "
                     f"got {rope_type!r}")
  missing = [k for k in _LLAMA3_KEYS if k not in s]
  if missing:
    raise ValueError(f"ModelConfig.rope_scaling is missing {missing}")
  if not s["high_freq_factor"] > s["low_freq_factor"]:
    raise ValueError("ModelConfig.rope_scaling: high_freq_factor must exceed low_freq_factor")
