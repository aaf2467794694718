import numpy as np
import pytest

from dapo_jax.train import dynamic_sampling
from dapo_jax.train.groups import Groups, training_batch


def _groups(correct_NxG, lengths=None, seed=0):
  c = np.asarray(correct_NxG, bool)
  N, G = c.shape
  lengths = np.full((N, G), 3, np.int32) if lengths is None else np.asarray(lengths, np.int32)
  score = np.where(c, 1.0, -1.0).astype(np.float32)
  rng = np.random.default_rng(seed)
  # Shaped rewards differ inside all-wrong groups: filtering must still use correctness.
  reward = score - rng.uniform(0, 0.5, (N, G)).astype(np.float32)
  R = int(lengths.max())
  return Groups(prompts=[[1, 2 + n] for n in range(N)], answers=[str(n) for n in range(N)],
                tokens=np.ones((N, G, R), np.int32), behav_logp=np.full((N, G, R), -0.5, np.float32),
                versions=np.zeros((N, G, R), np.int32),
                lengths=lengths, truncated=np.zeros((N, G), bool), correct=c,
                parsed=np.ones((N, G), bool), score=score, reward=reward)


def test_uniform_groups_hit_round_cap_with_clear_error():
  calls = []

  def gen(r, n):
    calls.append((r, n))
    return _groups(np.zeros((n, 4)) if r % 2 else np.ones((n, 4)))

  with pytest.raises(dynamic_sampling.DynamicSamplingError, match=r"0 mixed groups after 3 rounds"):
    dynamic_sampling.fill_batch(gen, batch_size=4, gen_batch_size=6, max_gen_rounds=3, dynamic=True)
  assert calls == [(0, 6), (1, 6), (2, 6)]


def test_mixed_batch_and_every_round_counted():
  rng = np.random.default_rng(0)
  rounds_made = []

  def gen(r, n):
    c = rng.random((n, 4)) < 0.5
    c[0] = True      # one all-correct group per round
    c[1] = False     # one all-wrong group per round
    rounds_made.append(c)
    return _groups(c, seed=r)

  batch, summary, rounds = dynamic_sampling.fill_batch(gen, batch_size=10, gen_batch_size=6,
                                                    max_gen_rounds=10, dynamic=True)
  assert len(batch) == 10
  n_correct = batch.correct.sum(axis=1)
  assert np.all((n_correct > 0) & (n_correct < 4))
  assert summary["gen_rounds"] == len(rounds) == len(rounds_made)
  assert summary["prompts_sampled"] == 6 * len(rounds_made)
  all_c = np.concatenate(rounds_made)
  acc = all_c.mean(axis=1)
  assert summary["frac_groups_acc_1"] == pytest.approx(np.mean(acc == 1.0))
  assert summary["frac_groups_acc_0"] == pytest.approx(np.mean(acc == 0.0))
  accepted = int(np.sum((all_c.sum(1) > 0) & (all_c.sum(1) < 4)))
  assert summary["surplus_discarded"] == accepted - 10
  assert summary["accepted_frac"] == pytest.approx(accepted / all_c.shape[0])
  assert summary["gen_tokens"] == 3 * all_c.size  # every round's responses, 3 tokens each


def test_without_dynamic_sampling_takes_one_round_whole():
  batch, summary, _ = dynamic_sampling.fill_batch(lambda r, n: _groups(np.ones((n, 4))),
                                               batch_size=5, gen_batch_size=99,
                                               max_gen_rounds=1, dynamic=False)
  assert len(batch) == 5 and summary["gen_rounds"] == 1 and summary["frac_groups_acc_1"] == 1.0


def test_training_batch_layout():
  g = _groups([[True, False]], lengths=[[2, 3]])
  g.truncated[0, 1] = True
  mb, resp = training_batch(g, np.array([[0.7, -0.7]]), seq_len=6, overlong_filter=True)
  np.testing.assert_array_equal(resp[1], [0, 0, 1, 1, 1, 0])  # response, filtered or not
  np.testing.assert_array_equal(mb.tokens_BxS[0], [1, 2, 1, 1, 0, 0])
  np.testing.assert_array_equal(mb.attn_mask_BxS[1], [1, 1, 1, 1, 1, 0])
  np.testing.assert_array_equal(mb.loss_mask_BxS[0], [0, 0, 1, 1, 0, 0])
  np.testing.assert_array_equal(mb.loss_mask_BxS[1], [0, 0, 0, 0, 0, 0])  # truncated: filtered
  np.testing.assert_allclose(mb.behav_logp_BxS[0], [0, 0, -0.5, -0.5, 0, 0])
  np.testing.assert_allclose(mb.adv_B, [0.7, -0.7])
  mb, _ = training_batch(g, np.array([[0.7, -0.7]]), seq_len=6, overlong_filter=False)
  np.testing.assert_array_equal(mb.loss_mask_BxS[1], [0, 0, 1, 1, 1, 0])
  with pytest.raises(ValueError, match="exceed seq_len"):
    training_batch(g, np.zeros((1, 2)), seq_len=4, overlong_filter=False)


@pytest.mark.parametrize("batch_size,rounds", [(3, 1), (4, 2), (6, 2), (7, 3)])
def test_generation_stops_at_the_round_that_fills_the_batch(batch_size, rounds):
  """3 of every 6 groups are mixed: the batch fills after ceil(batch / 3) rounds, no more."""
  calls = []

  def gen(r, n):
    calls.append(r)
    c = np.zeros((n, 4), bool)
    c[:3, 0] = True  # groups 0-2 mixed, 3-5 all wrong
    return _groups(c)

  batch, summary, per_round = dynamic_sampling.fill_batch(
      gen, batch_size=batch_size, gen_batch_size=6, max_gen_rounds=10, dynamic=True)
  assert calls == list(range(rounds))
  assert summary["gen_rounds"] == rounds == len(per_round)
  assert len(batch) == batch_size
  assert summary["surplus_discarded"] == 3 * rounds - batch_size


def test_generation_cost_accounting_hand_computed():
  # Round 0: 4 prompts, 1 mixed; round 1: 4 prompts, 3 mixed; batch of 3 kept groups. Responses
  # are 2 tokens long, but the last (uniform, discarded) group's are 3.
  def gen(r, n):
    c = np.zeros((n, 2), bool)
    c[:1 if r == 0 else 3, 0] = True
    lengths = np.full((n, 2), 2)
    lengths[-1] = 3
    return _groups(c, lengths=lengths)

  _, s, _ = dynamic_sampling.fill_batch(gen, batch_size=3, gen_batch_size=4, max_gen_rounds=5,
                                     dynamic=True)
  gen_tokens = 2 * (3 * 2 * 2 + 2 * 3)
  assert s["gen_rounds"] == 2 and s["gen_tokens"] == gen_tokens == 36
  assert s["gen_tokens_per_kept_group"] == pytest.approx(36 / 3)
  assert s["gen_groups_discarded_frac"] == pytest.approx(1 - 3 / 8)
  assert s["gen_tokens_discarded_frac"] == pytest.approx(1 - 3 * 4 / 36)


def test_generation_cost_of_a_single_kept_group():
  c = np.array([[True, False], [True, True]])  # one mixed group, one uniform
  _, s, _ = dynamic_sampling.fill_batch(lambda r, n: _groups(c), batch_size=1, gen_batch_size=2,
                                     max_gen_rounds=1, dynamic=True)
  assert s["gen_tokens_per_kept_group"] == s["gen_tokens"] == 2 * 2 * 3


def test_generation_cost_without_dynamic_sampling_counts_only_mixed_groups():
  c = np.array([[True, False], [True, True], [False, False], [False, True]])
  _, s, _ = dynamic_sampling.fill_batch(lambda r, n: _groups(c), batch_size=4, gen_batch_size=9,
                                     max_gen_rounds=1, dynamic=False)
  assert s["gen_tokens_per_kept_group"] == pytest.approx(8 * 3 / 2)  # 2 mixed of 4
  assert s["gen_groups_discarded_frac"] == 0.0 and s["gen_tokens_discarded_frac"] == 0.0


def test_format_rate_over_every_round():
  parsed_by_round = [np.array([[1, 0, 0, 0], [1, 1, 1, 1]], bool),
                     np.array([[0, 0, 0, 0], [1, 1, 0, 0]], bool)]

  def gen(r, n):
    c = np.zeros((n, 4), bool)
    c[0, 0] = True  # one mixed group per round
    g = _groups(c, seed=r)
    g.parsed = parsed_by_round[r]
    return g

  _, summary, rounds = dynamic_sampling.fill_batch(gen, batch_size=2, gen_batch_size=2,
                                                max_gen_rounds=3, dynamic=True)
  assert [x["format_rate"] for x in rounds] == [5 / 8, 2 / 8]
  assert summary["gen_format_rate"] == pytest.approx(7 / 16)  # all 16 responses, both rounds
