"""A claim's mechanism read from pilot runs: each measure per seed, against its stated floor."""
import pytest

from dapo_jax.analysis import ablations, mechanisms as am


def _run(seed, **series):
  """A RunLog whose train records carry the given per-step values (steps 1..n)."""
  n = len(next(iter(series.values())))
  train = [{"step": i + 1, **{k: v[i] for k, v in series.items()}} for i in range(n)]
  return ablations.RunLog(f"x_s{seed}", "x", seed, train, [], {"after": {"avg@8": 0.5}})


def _record(a, b="other", metric="avg@8"):
  return {"a": a, "b": b, "metric": metric}


def test_clip_reaches_its_floor_only_when_every_seed_does_and_acting_needs_a_020_arm():
  rec = _record("clip_higher")
  # run means 0.0015 and 0.0012: both >= 0.001
  both = [_run(0, clipfrac_upper=[0.001, 0.002]), _run(1, clipfrac_upper=[0.0012, 0.0012])]
  first = {"clip_higher": [_run(0, clipfrac_upper=[0.0002, 0.0004])]}
  e = am.evidence(rec, both, first, pilot="p")
  (m,) = e["measures"]
  # every seed binds above the floor, but without an eps_high 0.20 arm acting is not shown
  assert e["acts"] is None and "eps_high 0.20" in e["needs"]
  assert e["pilot_seeds"] == 2 and m["metric"] == "clipfrac_upper:run_mean"
  assert m["pilot"] == pytest.approx([0.0015, 0.0012])
  assert m["first_ladder_mean"] == pytest.approx(0.0003) and m["reached"]
  one_short = [both[0], _run(1, clipfrac_upper=[0.0005, 0.0009])]  # run mean 0.0007
  assert am.evidence(rec, one_short, first, pilot="p")["acts"] is False
  assert am.evidence(rec, [], first, pilot="p")["acts"] is False  # no pilot: nothing to act on


def test_dynamic_sampling_needs_both_kinds_of_uniform_groups():
  rec = _record("dapo", "token_level")
  runs = [_run(0, frac_groups_acc_1=[0.05, 0.07], frac_groups_acc_0=[0.0, 0.01])]
  e = am.evidence(rec, runs, {}, pilot="p")
  assert [m["reached"] for m in e["measures"]] == [True, False]  # all-wrong mean 0.005 < 0.01
  assert not e["acts"] and e["measures"][0]["first_ladder_mean"] is None


def test_fig3b_trend_is_descriptive_and_length_spread_is_p90_over_mean():
  rec = _record("token_level", None, "frac_groups_acc_1:slope")
  runs = [_run(0, frac_groups_acc_1=[0.02, 0.04, 0.06])]
  e = am.evidence(rec, runs, {}, pilot="p")
  share, trend = e["measures"]
  assert share["pilot"] == pytest.approx([0.04]) and trend["pilot"] == pytest.approx([0.02])
  assert trend["floor"] is None and trend["reached"] is None and e["acts"]
  # p90 / mean per step: 15/10 and 24/20 -> mean 1.35 >= 1.2
  spread = am.evidence(_record("token_level", "soft_overlong"),
                       [_run(0, response_length_p90=[15.0, 24.0],
                             response_length_mean=[10.0, 20.0])], {}, pilot="p")
  assert spread["measures"][0]["pilot"] == pytest.approx([1.35]) and spread["acts"]


def test_unknown_arm_is_an_error_naming_it():
  with pytest.raises(ValueError, match="no mechanism for arm 'gspo'"):
    am.measures_of(_record("gspo"))
