"""The pod rehearsal (experiments/rehearse_pod.py) in a shorter form: its config keeps the 32B
recipe's code path, and its kernel stage (the TPU paged and splash kernels in Pallas' TPU
interpret mode against the float32 reference on the same tokens) at a smaller width.

The full rehearsal (2 processes, a resume, the 32B proportions) runs as
`python experiments/rehearse_pod.py --steps=3 --json=F`; tests/test_multihost.py covers the
2-process loop and tests/test_resume*.py the resume."""
import os
import sys

import jax
import pytest

from configs import dapo_qwen25_32b, pod_rehearsal_cpu
from dapo_jax import config as config_lib
from dapo_jax.aot import shapes

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "experiments"))
import rehearse_kernels  # noqa: E402  pylint: disable=wrong-import-position
import rehearse_pod  # noqa: E402  pylint: disable=wrong-import-position


def test_rehearsal_config_is_the_pod_recipe_at_cpu_width():
  pod = config_lib.parse(dapo_qwen25_32b.get_config())
  arch = shapes.PRESETS["qwen2.5-32b"]  # the 32B's config.json (the pod config loads it)
  c = config_lib.parse(pod_rehearsal_cpu.get_config())
  m = c.model
  assert m.source == "config" and (m.dtype, m.param_dtype) == (pod.model.dtype, "float32")
  assert m.num_heads / m.num_kv_heads == arch["num_heads"] / arch["num_kv_heads"]
  assert m.head_dim == arch["head_dim"] and not m.tie_word_embeddings
  assert m.intermediate_size / m.hidden_size == arch["intermediate_size"] / arch["hidden_size"]
  assert c.train.num_minibatches == pod.train.num_minibatches == 16
  assert c.train.packing and c.rollout.paged_kv and c.task.chat_template
  assert c.algo.is_correction == "tis_token" and c.checkpoint.every_steps == 1
  assert (c.mesh.fsdp, c.mesh.tensor) == (-1, 2)
  # The pool is smaller than the rows need: 2 layers x 1 KV head per chip x 128 x K, V x bf16
  # = 16 KiB per 16-token page, so kv_cache_gib holds 19 pages per batch shard, fewer than its
  # 2 prompts' shared full pages (3 each) + 8 rows x their own pages (a partial prompt page
  # and the response: 2), and rows grow a few tokens a call, so samples are preempted.
  pages = int(c.rollout.kv_cache_gib * 2**30 // (16 * 2 * 1 * 128 * 2 * 2))
  rows_per_shard = c.rollout.num_slots // 4  # 2 hosts x data 2 of the sampler mesh
  full, partial = divmod(c.task.max_prompt_len, c.rollout.page_size)
  own = -(-(partial + c.rollout.max_new_tokens) // c.rollout.page_size)
  assert (pages, full, own) == (19, 3, 2)
  assert pages < rows_per_shard // c.rollout.group_size * full + rows_per_shard * own
  assert c.rollout.steps_per_call < c.rollout.max_new_tokens


def test_steps_below_two_refused(capsys):
  with pytest.raises(SystemExit):
    rehearse_pod.main(["--steps=1"])
  assert "--steps: must be >= 2" in capsys.readouterr().err


def _small():
  """The rehearsal's config at a width CI affords, with the tiny policy's tokenizer (no chat
  template) instead of SmolLM2's (writing it from the GGUF takes a minute)."""
  c = pod_rehearsal_cpu.get_config("tokenizer=dapo_jax/assets/tiny_base")
  c.model.update(hidden_size=128, intermediate_size=704, num_heads=4, num_kv_heads=2)
  c.task.chat_template = False
  c.task.max_prompt_len = 40           # tokens
  c.rollout.max_new_tokens = 8         # tokens
  c.algo.overlong_cache_len = 2
  return config_lib.parse(c)


def test_kernel_stage_small():
  """Both TPU kernels run (interpret mode, 4 of the 8 CPU devices); the float32 kernels equal
  the reference, the bf16 pod path is within its bf16 bounds (rehearse_pod.py's docstring)."""
  out = rehearse_kernels.run(_small(), num_prompts=1, devices=jax.devices()[:4])
  assert out["kernels_executed"] == ["paged_attention", "splash_attention"]
  assert out["failures"] == [], out
  d = out["detail"]
  assert d["kernel_only_logp_abs_diff_max"] <= rehearse_kernels.TOL["kernel_logp"]
  assert out["context_parallel_logp_abs_diff_max"] <= rehearse_kernels.TOL["kernel_logp"]
  # bf16 moves the log-probs (a check that compared float32 with itself would give 0).
  assert 0 < out["logp_abs_diff_max"] <= rehearse_kernels.TOL["logp"]
  assert d["paged_kernel_same_tokens_as_gather"]
