"""HF `config.json` dicts <-> ModelConfig keyword arguments (transformers 4.x and 5.x layouts).

Field names differ across transformers versions: the RoPE theta sits at the top level (4.x) or
in `rope_parameters` (5.x); Qwen3-MoE's expert count is `num_experts` (4.x, the published
checkpoints) or `num_local_experts` (what 5.x writes). Both are read; both are written.
"""
from __future__ import annotations

from typing import Any, Mapping

ARCHITECTURES = ("qwen2", "llama", "qwen3", "qwen3_moe")
HF_ARCH_NAMES = {
    "qwen2": "Qwen2ForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
}
LLAMA3_KEYS = ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings")


def check_supported(d: Mapping[str, Any]) -> str:
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


def rope_from_hf(d: Mapping[str, Any]) -> tuple[float, dict | None]:
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
  scaling = {k: rope[k] for k in LLAMA3_KEYS if k in rope}
  scaling.setdefault("original_max_position_embeddings", d.get("max_position_embeddings", 32768))
  scaling["rope_type"] = "llama3"
  return float(theta), scaling


def _moe_from_hf(d: Mapping[str, Any]) -> dict:
  """The expert fields of a qwen3_moe config (HF's defaults where a key is absent)."""
  experts = d.get("num_experts", d.get("num_local_experts"))
  if experts is None:
    raise KeyError("num_experts")
  return dict(num_experts=int(experts), num_experts_per_tok=int(d["num_experts_per_tok"]),
              moe_intermediate_size=int(d["moe_intermediate_size"]),
              norm_topk_prob=bool(d.get("norm_topk_prob", False)),
              decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
              mlp_only_layers=tuple(int(i) for i in d.get("mlp_only_layers") or ()))


def kwargs_from_hf(d: Mapping[str, Any]) -> dict:
  """ModelConfig keyword arguments of an HF config dict (KeyError for a missing field)."""
  model_type = check_supported(d)
  theta, scaling = rope_from_hf(d)
  heads = d["num_attention_heads"]
  kwargs = dict(
      vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
      intermediate_size=d["intermediate_size"], num_layers=d["num_hidden_layers"],
      num_heads=heads, num_kv_heads=d.get("num_key_value_heads") or heads,
      head_dim=d.get("head_dim") or d["hidden_size"] // heads,
      rope_theta=float(theta), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
      tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
      attention_bias=bool(d.get("attention_bias", model_type == "qwen2")),
      qk_norm=model_type in ("qwen3", "qwen3_moe"), rope_scaling=scaling,
      max_position_embeddings=d.get("max_position_embeddings", 32768),
      architecture=model_type)
  if model_type == "qwen3_moe":
    kwargs.update(_moe_from_hf(d))
  return kwargs


def _check_exportable(cfg):
  """The architecture's fixed features: a config without them cannot be written as it."""
  arch = cfg.architecture
  if arch == "qwen2" and not cfg.attention_bias:
    raise ValueError("Qwen2 checkpoints always have q/k/v biases; "
                     "ModelConfig.attention_bias=False cannot be exported as qwen2")
  if arch in ("qwen3", "qwen3_moe") and not cfg.qk_norm:
    raise ValueError(f"{arch} checkpoints always have q/k norms; qk_norm=False cannot be "
                     f"exported as {arch}")
  if arch not in ("qwen3", "qwen3_moe") and cfg.qk_norm:
    raise ValueError(f"qk_norm=True cannot be exported as {arch}")


def to_hf(cfg) -> dict:
  """The HF `config.json` dict that transformers loads into the same architecture."""
  _check_exportable(cfg)
  rope = {"rope_theta": cfg.rope_theta, "rope_type": "default"}
  if cfg.rope_scaling:
    rope.update(cfg.rope_scaling)
  d = {
      "architectures": [HF_ARCH_NAMES[cfg.architecture]],
      "model_type": cfg.architecture,
      "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
      "intermediate_size": cfg.intermediate_size,
      "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
      "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
      "hidden_act": "silu", "rms_norm_eps": cfg.rms_norm_eps,
      "max_position_embeddings": cfg.max_position_embeddings,
      "tie_word_embeddings": cfg.tie_word_embeddings,
      "rope_parameters": rope, "rope_theta": cfg.rope_theta,
      "dtype": cfg.param_dtype, "torch_dtype": cfg.param_dtype,
      "use_cache": True,
  }
  if cfg.architecture != "qwen2":
    d["attention_bias"] = cfg.attention_bias
  if cfg.architecture == "llama":
    d["mlp_bias"] = False
  if cfg.architecture == "qwen3_moe":  # both spellings of the expert count (see module doc)
    d.update(num_experts=cfg.num_experts, num_local_experts=cfg.num_experts,
             num_experts_per_tok=cfg.num_experts_per_tok,
             moe_intermediate_size=cfg.moe_intermediate_size,
             norm_topk_prob=cfg.norm_topk_prob, decoder_sparse_step=cfg.decoder_sparse_step,
             mlp_only_layers=list(cfg.mlp_only_layers))
  if cfg.rope_scaling:
    d["rope_scaling"] = dict(cfg.rope_scaling)
  return d
