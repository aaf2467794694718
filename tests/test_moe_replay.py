"""Routing replay end to end: the sampler records every token's experts, they travel with the
groups into the training rows (and onto packed rows), and the trainer's forward routed by them
gives the sampler's log-probs; without them a router with near-ties routes differently."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.rollout.sampler import make_sampler
from dapo_jax.train import groups as groups_lib
from dapo_jax.train import packing
from dapo_jax.train.objective import RouteStats, logprobs, route_metrics

# Two experts, one per token: a token's expert is the sign of a router-logit difference.
CFG = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=False, qk_norm=True,
                  architecture="qwen3_moe", num_experts=2, num_experts_per_tok=1,
                  moe_intermediate_size=16, norm_topk_prob=True)
N, G, P_LEN, SEQ = 4, 2, 8, 32


def _near_tie_model():
  """Expert 1's router column is expert 0's one float32 ulp away (away from zero): the two
  logits differ by about their rounding error, so the ulp-level differences between the decode
  step and the full forward decide many tokens' expert. The experts' weights are scaled up so
  that a different expert changes the log-probs clearly."""
  m = Qwen2(CFG, rngs=nnx.Rngs(0))
  nnx.update(m, jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, nnx.state(m, nnx.Param)))
  w = np.array(m.layers.router.get_value())
  w[..., 1] = np.nextafter(w[..., 0], np.float32(np.inf) * np.sign(w[..., 0]))
  m.layers.router.set_value(jnp.asarray(w))
  return m


def _groups(rollout, prompts):
  zeros = np.zeros((N, G), np.float32)
  return groups_lib.Groups(
      prompts=prompts, answers=[""] * N, tokens=rollout.tokens, behav_logp=rollout.logprobs,
      versions=rollout.versions, lengths=rollout.lengths, truncated=rollout.truncated,
      correct=zeros > 0, parsed=zeros > 0, score=zeros, reward=zeros,
      expert_ids=rollout.expert_ids, prompt_expert_ids=rollout.prompt_expert_ids)


@pytest.fixture(scope="module")
def sampled():
  model = _near_tie_model()
  sampler = make_sampler(model, num_slots=8, max_prompt_len=P_LEN, max_len=SEQ,
                         steps_per_call=4, record_experts=True)
  rng = np.random.default_rng(0)
  prompts = [rng.integers(4, CFG.vocab_size, size=int(rng.integers(2, P_LEN + 1))).tolist()
             for _ in range(N)]
  r = sampler.sample_groups(prompts, group_size=G, max_new_tokens=20, temperature=1.0, seed=1)
  batch, resp = groups_lib.training_batch(_groups(r, prompts), np.zeros((N, G)), seq_len=SEQ,
                                          overlong_filter=False)
  return model, r, batch, resp


def _trainer_logp(model, tokens, mask, ids, **kw):
  graphdef, params = nnx.split(model, nnx.Param)
  ids = None if ids is None else jnp.asarray(ids)
  logp, _, routing = logprobs(graphdef, params, jnp.asarray(tokens), jnp.asarray(mask),
                              with_entropy=False, expert_ids_BxSxLxK=ids, **kw)
  return np.asarray(logp), routing


def test_replayed_trainer_logprobs_equal_the_samplers(sampled):
  model, _, batch, resp = sampled
  own, own_routing = _trainer_logp(model, batch.tokens_BxS, batch.attn_mask_BxS, None)
  replayed, routing = _trainer_logp(model, batch.tokens_BxS, batch.attn_mask_BxS,
                                    batch.expert_ids_BxSxLxK)
  gap = lambda x: np.abs(np.where(resp, x - batch.behav_logp_BxS, 0.0))
  # f32, the same weights: replay leaves only the two code paths' rounding (1e-5 here).
  assert gap(replayed).max() <= 1e-4
  # Without replay the near-ties route differently (about a third of token-layers on this
  # host) and most response tokens' log-probs move (they follow a flipped token).
  assert gap(own).max() > 0.1 and (gap(own) > 1e-3).mean() > 0.1
  used = np.asarray(own_routing.expert_ids_LxBxTxK).transpose(1, 2, 0, 3)
  valid = batch.attn_mask_BxS > 0
  share_L = (used == batch.expert_ids_BxSxLxK).all(-1)[valid].mean(0)
  assert 0.2 < share_L.mean() < 0.95
  # The replayed pass counts its router's own picks that equal the replayed ones: in layer 0
  # (the same input with or without replay) exactly the unreplayed pass's agreement.
  agree_L = np.asarray(routing.agree_L) / float(routing.num_tokens)
  np.testing.assert_allclose(agree_L[0], share_L[0], atol=1e-6)
  assert 0.2 < agree_L.mean() < 0.95
  assert float(own_routing.agree_L.sum()) == float(own_routing.num_tokens) * 2  # no replay


def test_recorded_experts_sit_where_their_tokens_are(sampled):
  _, r, batch, resp = sampled
  ids, valid = batch.expert_ids_BxSxLxK, batch.attn_mask_BxS > 0
  assert ids.dtype == np.int16 and ids.shape == (N * G, SEQ, len(CFG.moe_layers), 1)
  assert (ids[valid] >= 0).all() and (ids[~valid] == -1).all()
  for b in range(N * G):
    n, g = divmod(b, G)
    plen = int(valid[b].sum()) - int(r.lengths[n, g])
    np.testing.assert_array_equal(ids[b, :plen], r.prompt_expert_ids[n, :plen])
    np.testing.assert_array_equal(ids[b, plen:plen + r.lengths[n, g]],
                                  r.expert_ids[n, g, :r.lengths[n, g]])
    assert (r.expert_ids[n, g, r.lengths[n, g]:] == -1).all()
  assert resp.sum() == r.lengths.sum()


def test_replay_on_packed_rows(sampled):
  """The experts moved onto packed rows (`packing.to_rows`) route the packed forward the same:
  unpacked, its log-probs are the sampler's."""
  model, _, batch, resp = sampled
  k = 2
  plan = packing.pack(batch.tokens_BxS, batch.attn_mask_BxS, micro_batches=k)
  rows = packing.to_rows(batch.expert_ids_BxSxLxK, plan, batch.attn_mask_BxS,
                         micro_batches=k, fill=-1)
  logp, _ = _trainer_logp(model, plan.tokens_BxS, plan.segments_BxS > 0, rows,
                          positions_BxS=jnp.asarray(plan.positions_BxS),
                          segment_ids_BxS=jnp.asarray(plan.segments_BxS))
  got = packing.unpack(logp, plan, batch.attn_mask_BxS, micro_batches=k)
  assert np.abs(np.where(resp, got - batch.behav_logp_BxS, 0.0)).max() <= 1e-4


def test_to_rows_inverts_unpack():
  tokens = np.array([[5, 6, 7, 0], [8, 0, 0, 0], [9, 1, 0, 0], [2, 3, 4, 0]], np.int32)
  mask = (tokens > 0).astype(np.float32)
  plan = packing.pack(tokens, mask, micro_batches=2)
  values = np.where(mask > 0, tokens * 10, 0).astype(np.int32)
  rows = packing.to_rows(values, plan, mask, micro_batches=2, fill=-1)
  # Every packed position holding a token holds that token's value, the rest the fill.
  np.testing.assert_array_equal(rows, np.where(plan.segments_BxS > 0, plan.tokens_BxS * 10, -1))
  np.testing.assert_array_equal(packing.unpack(rows, plan, mask, micro_batches=2), values)


def test_groups_select_and_concat_keep_the_experts(sampled):
  _, r, _, _ = sampled
  g = _groups(r, [[1]] * N)
  both = groups_lib.Groups.concat([g.select([2]), g.select([0, 1])])
  np.testing.assert_array_equal(both.expert_ids, r.expert_ids[[2, 0, 1]])
  np.testing.assert_array_equal(both.prompt_expert_ids, r.prompt_expert_ids[[2, 0, 1]])
  dense = dataclasses.replace(g, expert_ids=None, prompt_expert_ids=None)
  assert groups_lib.Groups.concat([dense, dense]).expert_ids is None


def test_route_metrics_by_hand():
  # Two micro-batches: 3 of 4 and 1 of 4 token-layers agree; loads per layer summed over them.
  route = RouteStats(agree=jnp.array([3.0, 1.0]), token_layers=jnp.array([4.0, 4.0]),
                     load_LxE=jnp.array([[[1.0, 1.0], [3.0, 1.0]], [[1.0, 1.0], [1.0, 1.0]]]),
                     balance_x_tokens=jnp.array([2.0 * 4, 3.5 * 2]), tokens=jnp.array([4.0, 2.0]))
  m = route_metrics(route, replayed=True)
  np.testing.assert_allclose(m["routing_agreement"], 0.5)
  np.testing.assert_allclose(m["router_aux_loss"], 15.0 / 6.0, rtol=1e-6)  # token-weighted
  # layer 0: (2, 2) balanced = 1; layer 1: (4, 2), max 4 over mean 3.
  np.testing.assert_allclose(m["expert_load_max"], 4.0 / 3.0, rtol=1e-6)
  assert "routing_agreement" not in route_metrics(route, replayed=False)


def test_recording_needs_a_moe_model_and_the_config_says_so():
  from configs import tiny_cpu
  from dapo_jax import config as config_lib
  dense = dataclasses.replace(CFG, architecture="qwen3", num_experts=0)
  with pytest.raises(ValueError, match="record_experts: the model has no MoE layer"):
    make_sampler(Qwen2(dense, rngs=nnx.Rngs(0)), num_slots=2, max_prompt_len=4, max_len=8,
                 record_experts=True)
  c = tiny_cpu.get_config("init=True")
  c.model.routing_replay = True
  with pytest.raises(ValueError, match="config.model.routing_replay: needs a mixture-of-experts"):
    config_lib.parse(c)
