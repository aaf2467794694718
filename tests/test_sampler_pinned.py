"""Pins `sample_groups`' tokens and log-probs for fixed seeds, so speed work on the decode path
cannot silently change what the sampler draws.

The constants below were generated with the implementation of commit 2d79f42 (before the
decode speed changes: layer scan, full-cache attention, [L, B, S, Kv, Hd] cache), by running
exactly `_sample` below and printing the outputs (log-probs rounded to 6 decimals).
Tokens must match exactly; log-probs to 1e-4 (a different float32 reduction order is allowed).
Both decode layer loops are pinned: per-layer (CPU's default) and scanned (accelerators'), with
the dense cache and with the paged one (pages of 4 tokens; same tokens and log-probs).
"""
import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.qwen2 import ModelConfig, Qwen2
from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler

CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8)
PROMPTS = [[60, 41, 45, 57, 38], [50, 54, 17, 7, 22, 21, 56, 58, 4, 33, 53, 11], [51]]
PLAIN_TOKENS = np.array([[[44, 53, 17, 62, 57, 37, 17, 3, 0, 0], [40, 59, 45, 39, 33, 27, 8, 4, 5, 40], [40, 59, 46, 44, 39, 33, 27, 17, 15, 41]],
    [[11, 23, 3, 0, 0, 0, 0, 0, 0, 0], [15, 40, 52, 52, 52, 1, 55, 14, 14, 56], [15, 40, 52, 52, 32, 39, 52, 1, 36, 62]],
    [[45, 15, 17, 9, 21, 9, 15, 19, 25, 51], [45, 15, 17, 20, 17, 25, 3, 0, 0, 0], [45, 15, 55, 15, 25, 20, 60, 35, 21, 46]]])
PLAIN_LENGTHS = np.array([[8, 10, 10], [3, 10, 10], [10, 7, 10]])
PLAIN_LOGP = np.array([[[-3.158670, -3.429014, -2.115846, -0.847104, -0.228201, -4.826464, -1.337478, -0.944374, 0.000000, 0.000000], [-0.772392, -0.668565, -1.436663, -4.607824, -0.285346, -0.226745, -2.604713, -0.373935, -6.218638, -3.361422], [-0.772392, -0.668565, -0.773590, -5.598094, -0.854409, -1.870333, -0.468476, -2.861283, -0.197587, -0.173357]],
    [[-2.897536, -1.076380, -0.407421, 0.000000, 0.000000, 0.000000, 0.000000, 0.000000, 0.000000, 0.000000], [-0.671195, -1.154066, -0.073268, -0.249856, -0.430992, -0.787377, -0.773412, -0.063471, -0.201786, -1.804915], [-0.671195, -1.154066, -0.073268, -0.249856, -4.642318, -1.226559, -0.102076, -4.151400, -2.033703, -0.386752]],
    [[-0.256730, -0.109033, -1.070289, -1.651681, -1.854806, -1.155648, -3.031959, -0.850117, -2.292936, -2.820540], [-0.256730, -0.109033, -1.070289, -0.547807, -0.453042, -1.144975, -0.154376, 0.000000, 0.000000, 0.000000], [-0.256730, -0.109033, -8.186976, -1.328531, -0.729803, -0.392344, -1.554577, -0.675062, -2.985356, -2.897378]]])
TRUNCATED_TOKENS = np.array([[[27, 27, 27, 23, 27, 51, 23, 33, 23, 54], [39, 51, 48, 20, 3, 0, 52, 8, 37, 23], [40, 39, 51, 30, 25, 28, 20, 39, 44, 0]],
    [[15, 3, 4, 3, 52, 8, 3, 17, 28, 27], [53, 14, 8, 39, 41, 44, 46, 23, 19, 36], [15, 40, 52, 52, 52, 1, 55, 14, 14, 25]],
    [[45, 15, 9, 52, 21, 61, 25, 51, 20, 25], [45, 15, 17, 20, 15, 46, 27, 30, 45, 4], [45, 15, 9, 44, 15, 51, 15, 21, 52, 52]]])
TRUNCATED_LENGTHS = np.array([[10, 10, 10], [10, 10, 10], [10, 10, 10]])
TRUNCATED_LOGP = np.array([[[-3.350679, -0.719463, -0.417974, -0.441061, -0.027916, -0.197935, -0.378716, -0.034687, -0.391471, -1.559876], [-2.156102, -1.247076, -2.047276, -0.391181, -0.018547, -0.203565, -1.143892, -0.308413, -0.017495, -1.701311], [-0.400749, -1.052323, -2.114619, -1.955430, -0.395200, -1.630424, -1.730808, -0.043681, -1.118445, -0.003516]],
    [[-0.302905, -1.357668, -0.857968, -0.100610, -0.943319, -0.095602, -1.803582, -0.954056, -0.184231, -0.145645], [-3.372759, -0.193468, -1.649265, -1.665270, -0.029719, -1.079230, -1.048791, -0.602304, -0.255225, -0.805795], [-0.302905, -0.780107, -0.012658, -0.087915, -0.176986, -0.423277, -0.449159, -0.009405, -0.049352, -1.098324]],
    [[-0.096195, -0.024342, -1.247959, -1.277114, -0.354128, -0.083542, -0.366183, -0.378687, -0.631972, -0.352154], [-0.096195, -0.024342, -0.990757, -0.283912, -1.965541, -2.111288, -0.125790, -1.039646, -0.023235, -0.612517], [-0.096195, -0.024342, -1.247959, -0.977282, -0.076704, -0.081216, -0.191502, -0.216413, -1.956957, -1.605209]]])
SETTINGS = {
    "plain": dict(temperature=1.0, seed=11, eos_ids=(3,)),
    "truncated": dict(temperature=0.7, top_p=0.9, top_k=20, seed=5),
}
EXPECTED = {
    "plain": (PLAIN_TOKENS, PLAIN_LENGTHS, PLAIN_LOGP),
    "truncated": (TRUNCATED_TOKENS, TRUNCATED_LENGTHS, TRUNCATED_LOGP),
}


@pytest.fixture(scope="module", params=["unrolled", "scan", "paged-unrolled", "paged-scan"])
def sampler(request):
  """Peaked tiny model (weights x4, LM head x32), 4 slots for 9 samples: slots are refilled."""
  paged, _, loop = request.param.rpartition("-")
  m = Qwen2(CFG, rngs=nnx.Rngs(0))
  nnx.update(m, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, nnx.state(m, nnx.Param)))
  m.lm_head.set_value(m.lm_head.get_value() * 8.0)
  return GroupSampler(Engine(m, num_slots=4, max_prompt_len=12, max_len=24, steps_per_call=5,
                             layer_loop=loop, paged_kv=bool(paged), page_size=4))


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_sample_groups_pinned(sampler, name):
  r = sampler.sample_groups(PROMPTS, group_size=3, max_new_tokens=10, **SETTINGS[name])
  tokens, lengths, logp = EXPECTED[name]
  np.testing.assert_array_equal(r.lengths, lengths)
  np.testing.assert_array_equal(r.tokens, tokens)
  np.testing.assert_allclose(r.logprobs, logp, atol=1e-4, rtol=0)
