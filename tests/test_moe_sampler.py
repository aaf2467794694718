"""A Qwen3-MoE policy through the unchanged rollout Engine: the paged KV cache (per-layer and
scanned decode loops) gives the full forward's greedy tokens and its log-probs."""
import dataclasses

import numpy as np
import pytest

from dapo_jax.rollout.engine import Engine
from dapo_jax.rollout.sampler import GroupSampler, make_sampler
from tests import greedy_parity
from tests.test_moe import CFG, _model
from tests.test_rollout_sampler import MAX_LEN, P_LEN, _greedy_reference, _teacher_forced

# Layer 1 dense between MoE layers 0 and 2: the mixed form runs every decode loop per layer.
MIXED = dataclasses.replace(CFG, mlp_only_layers=(1,))


def _prompts(n, seed):
  rng = np.random.default_rng(seed)
  return [rng.integers(4, CFG.vocab_size, size=int(rng.integers(2, P_LEN + 1))).tolist()
          for _ in range(n)]


@pytest.mark.parametrize("cfg,layer_loop", [(CFG, "scan"), (MIXED, "unrolled")])
def test_paged_greedy_equals_full_forward(cfg, layer_loop):
  """layer_loop "scan": the accelerator form (stacked pool, lax.scan over the layers)."""
  model = _model(cfg)
  sampler = GroupSampler(Engine(model, num_slots=4, max_prompt_len=P_LEN, max_len=MAX_LEN,
                                steps_per_call=4, paged_kv=True, page_size=8,
                                layer_loop=layer_loop))
  prompts = _prompts(3, seed=5)
  r = sampler.sample_groups(prompts, group_size=2, max_new_tokens=10, temperature=0.0, seed=9)
  greedy_parity.assert_groups_greedy(r, prompts, lambda p, n: _greedy_reference(model, p, n),
                                     steps=10, group_size=2)
  assert len(set(r.tokens.ravel().tolist())) > 3


def test_paged_logprobs_equal_teacher_forced():
  model = _model(MIXED)
  sampler = make_sampler(model, num_slots=4, max_prompt_len=P_LEN, max_len=MAX_LEN,
                         steps_per_call=4, paged_kv=True, page_size=8)
  prompts = _prompts(2, seed=2)
  r = sampler.sample_groups(prompts, group_size=2, max_new_tokens=12, temperature=1.0, seed=1)
  ref = _teacher_forced(model, prompts, r, 1.0)
  mask = np.arange(r.tokens.shape[-1])[None, None, :] < r.lengths[:, :, None]
  assert np.abs(np.where(mask, ref - r.logprobs, 0.0)).max() <= 1e-4
