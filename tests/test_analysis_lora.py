"""The LoRA rank sweep read (dapo_jax.analysis.lora_ranks): arms by rank and learning rate,
paired by seed against the full-weight dapo runs, unfinished runs left out."""
import math

import pytest
from scipy import stats

from dapo_jax.analysis import ablations, lora_ranks


def _run(group, seed, before, after):
  results = {"before": {"avg@8": before}, "after": {"avg@8": after}} if after is not None else {}
  return ablations.RunLog(f"{group}_s{seed}", group, seed, [], [], results)


def _runs(*items):
  return {r.name: r for r in items}


def test_ranks_are_paired_with_the_full_weight_runs_of_their_seeds():
  full = _runs(*[_run("dapo", s, 0.4, a) for s, a in enumerate((0.60, 0.62, 0.58, 0.9))],
               _run("token_level", 0, 0.4, 0.1))
  lora = _runs(_run("lora_r8", 0, 0.4, 0.50), _run("lora_r8", 1, 0.4, 0.54),
               _run("lora_r8", 2, 0.4, 0.46), _run("lora_r32", 0, 0.4, 0.45),
               _run("lora_r32", 1, 0.4, None), _run("eps_x", 0, 0.4, 0.3))
  rows = lora_ranks.table(lora, full)
  assert [r["arm"] for r in rows] == ["full", "rank 8", "rank 32"]
  assert rows[0]["seeds"] == [0, 1, 2]  # seed 3 ran no adapter arm
  assert rows[0]["avg@8_after"] == pytest.approx(0.60) and rows[0]["gain"] == pytest.approx(0.2)
  r8 = rows[1]
  assert r8["minus_full"] == pytest.approx(-0.10) and r8["paired_seeds"] == 3
  assert r8["minus_full_ci"] == pytest.approx(4.302653 * 0.02 / math.sqrt(3), rel=1e-5)
  p = 2 * stats.t.sf(0.10 / (0.02 / math.sqrt(3)), 2)  # diffs -0.10, -0.08, -0.12
  assert r8["p"] == pytest.approx(p, rel=1e-6)
  assert r8["p_holm"] == pytest.approx(2 * p, rel=1e-6)  # rank 32's missing p still counts
  r32 = rows[2]
  assert r32["seeds"] == [0] and r32["minus_full"] == pytest.approx(-0.15)
  assert r32["unfinished"] == [1] and r8["unfinished"] == []
  assert math.isnan(r32["minus_full_ci"])
  text = lora_ranks.render(rows)
  assert "rank 32" in text and "-0.100 [" in text and "(unfinished: seed 1)" in text


def test_learning_rate_arms_are_rows_of_their_own():
  import importlib  # pylint: disable=import-outside-toplevel
  assert lora_ranks.LR_FACTOR == importlib.import_module("configs.ladder").LORA_LR_FACTOR
  full = _runs(*[_run("dapo", s, 0.4, 0.6) for s in range(2)])
  lora = _runs(_run("lora_r32_lr100x", 0, 0.4, 0.7), _run("lora_r32", 0, 0.4, 0.5),
               _run("lora_r8_lr30x", 0, 0.4, 0.55), _run("lora_r32_lr30x", 1, 0.4, 0.65))
  rows = lora_ranks.table(lora, full)
  assert [r["arm"] for r in rows] == ["full", "rank 8 30x", "rank 32", "rank 32 30x",
                                      "rank 32 100x"]
  assert [r["minus_full"] for r in rows[1:]] == pytest.approx([-0.05, -0.1, 0.05, 0.1])
  assert rows[0]["seeds"] == [0, 1]


def test_each_arm_reports_how_far_its_updates_moved_the_policy():
  def logged(group, seed, kls, entropies):
    train = [{"step": i + 1, "entropy": e} | ({"approx_kl": kls[i]} if i < len(kls) else {})
             for i, e in enumerate(entropies)]
    return ablations.RunLog(f"{group}_s{seed}", group, seed, train, [],
                            {"before": {"avg@8": 0.4}, "after": {"avg@8": 0.5}})
  ent = [1.0] * 3 + [0.5] * lora_ranks.LAST_STEPS
  full = _runs(logged("dapo", 0, [0.001, 0.003], ent), logged("dapo", 1, [0.002], ent))
  lora = _runs(logged("lora_r8", 0, [0.01, 0.03], ent), logged("lora_r8", 1, [0.1], [4.0]))
  rows = lora_ranks.table(lora, full)
  assert rows[0]["approx_kl_per_seed"] == pytest.approx([0.002, 0.002])
  assert rows[1]["approx_kl"] == pytest.approx((0.02 + 0.1) / 2)
  assert rows[0]["entropy_end"] == pytest.approx(0.5)
  assert rows[1]["entropy_end"] == pytest.approx((0.5 + 4.0) / 2)
  assert "0.06000" in lora_ranks.render(rows)
