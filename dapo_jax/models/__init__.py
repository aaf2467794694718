"""Policy model (Qwen2 family and Qwen3-MoE in Flax NNX) and Hugging Face checkpoint I/O."""
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2, routed_token_logprobs, token_logprobs

__all__ = ["ModelConfig", "Qwen2", "routed_token_logprobs", "token_logprobs"]
