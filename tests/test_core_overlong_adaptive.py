"""core.overlong's adaptive ramp: hand-computed L_cache, window, clamping, fallback, history."""
import numpy as np
import pytest

from dapo_jax.core import overlong


def _cache(history, step, **kw):
  args = dict(window=2, percentile=50.0, max_len=100, fallback=12)
  args.update(kw)
  return overlong.adaptive_cache_len(history, step=step, **args)


def test_percentile_of_recent_steps_sets_the_ramp_start():
  history = {0: [np.array([10, 20])], 1: [np.array([30, 40]), np.array([50])]}
  # Step 2, window 2: lengths 10..50; median ("higher") 30 -> ramp from 30, L_cache 70.
  assert _cache(history, 2) == 70
  assert _cache(history, 2, percentile=100.0) == 50  # the longest recent response
  assert _cache(history, 2, percentile=0.0) == 90
  # Window 1 at step 2: only step 1's lengths (30, 40, 50): median 40.
  assert _cache(history, 2, window=1) == 60
  # The current step's own lengths never count: rounds of one step share one L_cache.
  assert _cache(history, 1) == _cache({0: history[0]}, 1) == 80  # median "higher" of 10, 20


def test_clamped_and_fallback():
  assert _cache({0: [np.array([500, 700])]}, 1) == 0  # beyond max_len: a hard cut at max_len
  assert _cache({}, 0) == 12 and _cache({0: [np.array([5])]}, 5) == 12  # nothing recent
  with pytest.raises(ValueError, match="percentile"):
    _cache({}, 0, percentile=101)
  with pytest.raises(ValueError, match="window"):
    _cache({}, 0, window=0)


def test_record_lengths_is_pure_and_prunes_old_steps():
  h0 = {0: [np.array([1])], 3: [np.array([2])]}
  h1 = overlong.record_lengths(h0, step=4, lengths=np.array([[5, 6]]), window=2)
  assert set(h0) == {0, 3} and len(h0[3]) == 1  # input untouched
  assert set(h1) == {3, 4}
  np.testing.assert_array_equal(h1[4][0], [[5, 6]])
  h2 = overlong.record_lengths(h1, step=4, lengths=[7], window=2)
  assert [x.tolist() for x in h2[4]] == [[[5, 6]], [7]]
  assert _cache(h2, 5, window=2, max_len=10) == 4  # lengths 2, 5, 6, 7: median "higher" 6


def test_history_state_round_trips_through_json():
  import json  # pylint: disable=g-import-not-at-top
  h = {3: [np.array([[1, 2], [3, 4]]), np.array([[5, 6]])], 4: [np.array([[7, 8]])]}
  back = overlong.history_from_state(json.loads(json.dumps(overlong.history_state(h))))
  assert back.keys() == h.keys()
  for s in h:
    for a, b in zip(h[s], back[s], strict=True):
      np.testing.assert_array_equal(a, b)
  assert _cache(back, 5, window=2, max_len=10) == _cache(h, 5, window=2, max_len=10)
