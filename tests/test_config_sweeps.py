"""configs/ladder.py's rungs and sweeps are data: each rung flips its technique's switches, each
sweep names its runs and overrides, the paper-schedule base and the campaign's phases."""
import importlib

import pytest

from dapo_jax import config as config_lib

def test_ladder_rungs_flip_switches():
  ladder = importlib.import_module("configs.ladder")
  seen = [config_lib.parse(ladder.get_config(f"rung={r}")).algo for r in ladder.RUNGS]
  sig = [(a.overlong_filter, a.eps_high, a.overlong_penalty, a.loss_agg, a.dynamic_sampling)
         for a in seen]
  assert sig[0] == (False, 0.2, False, "seq-mean-token-mean", False)
  assert sig[-1] == (False, 0.28, True, "token-mean", True)
  assert len(set(sig)) == 6, "every rung must differ from every other"
  with pytest.raises(ValueError, match="unknown rung"):
    ladder.get_config("rung=ppo")


def test_sweeps_are_data():
  ladder = importlib.import_module("configs.ladder")
  runs = ladder.get_sweep("ladder")
  assert len(runs) == 6 * len(ladder.SEEDS)
  assert len({r["name"] for r in runs}) == len(runs)
  eps = ladder.get_sweep("eps_high")
  # The DAPO rung's own point (0.28, L_cache 16) is the ladder's dapo runs, not re-run.
  assert sorted({r["overrides"]["algo.eps_high"] for r in eps}) == [0.2, 0.36, 0.44]
  assert 0.28 in ladder.EPS_HIGH and ladder.get_config().algo.eps_high == 0.28
  assert len(eps) == 3 * len(ladder.SWEEP_SEEDS) and len(ladder.SEEDS) >= 5
  lc = ladder.get_sweep("l_cache")
  max_new = ladder.get_config().rollout.max_new_tokens
  own = ladder.get_config().algo.overlong_cache_len
  assert own == int(round(0.25 * max_new)) and 0.25 in ladder.L_CACHE_FRACTIONS
  assert sorted({r["overrides"]["algo.overlong_cache_len"] for r in lc}) == sorted(
      {int(round(f * max_new)) for f in (0, 0.5)})
  assert len(lc) == 2 * len(ladder.SWEEP_SEEDS)
  beyond = ladder.get_sweep("beyond")
  assert [r["overrides"] for r in beyond[::len(ladder.SWEEP_SEEDS)]] == [
      {"algo.prefilter": True}, {"algo.overlong_adaptive": True}]
  pool = ladder.get_sweep("prefilter_pool")  # off / on / looser arms per seed, one small pool
  assert [(r["overrides"]["algo.prefilter"], r["overrides"].get("algo.prefilter_margin", 0))
          for r in pool] == [(False, 0), (True, 0), (True, 0.1)] * len(ladder.SWEEP_SEEDS)
  assert {r["overrides"]["task.num_train"] for r in pool} == {ladder.PREFILTER_POOL}
  base = ladder.get_config()
  draws = base.train.num_steps * base.algo.gen_batch_size  # prompts drawn at one round a step
  assert draws >= (base.algo.prefilter_min_seen + 2) * ladder.PREFILTER_POOL < base.task.num_train
  with pytest.raises(ValueError, match="unknown sweep"):
    ladder.get_sweep("nope")


def test_eps_pilot_sweep_pairs_each_setting_and_seed():
  ladder = importlib.import_module("configs.ladder")
  runs = ladder.get_sweep("eps_pilot")
  assert len(runs) == len(ladder.EPS_PILOT) * 2 * 3
  pairs = {}
  for r in runs:
    setting, _, seed = r["name"].rpartition("_s")
    pairs.setdefault((setting.rpartition("_eps")[0], seed), set()).add(
        r["overrides"]["algo.eps_high"])
  assert all(v == {0.2, 0.28} for v in pairs.values()) and len(pairs) == 9
  assert runs[0]["arg"] == "rung=dapo,seed=0"


def test_loss_mode_sweep_runs_each_mode_at_its_own_clip_range():
  from dapo_jax.core import loss_modes
  ladder = importlib.import_module("configs.ladder")
  runs = ladder.get_sweep("loss_mode")
  assert len(runs) == len(loss_modes.MODES) * len(ladder.SWEEP_SEEDS)
  for r in runs[::len(ladder.SWEEP_SEEDS)]:
    c = ladder.get_config(r["arg"])
    for key, value in r["overrides"].items():
      section, field = key.split(".")
      c[section][field] = value
    algo = config_lib.parse(c).algo
    defaults = loss_modes.MODES[algo.loss_mode].defaults
    assert r["name"] == f"{algo.loss_mode}_s0"
    params = algo.loss_params()
    for k in ("eps_low", "eps_high"):
      if k in defaults:
        assert params[k] == defaults[k], (algo.loss_mode, k)
  assert {r["overrides"]["algo.loss_mode"] for r in runs} == set(loss_modes.MODES)


def test_paper_schedule_base_and_the_campaign_sweeps():
  ladder = importlib.import_module("configs.ladder")
  c = config_lib.parse(ladder.get_config("rung=clip_higher,base=testbed16"))
  assert c.train.num_minibatches == 16 and c.minibatch_seqs == 16  # 1 prompt x G per update
  assert c.optim.lr == ladder.LR16 and c.model.hf_path == ladder.BASE16
  assert c.algo.eps_high == 0.28 and not c.algo.dynamic_sampling
  m = config_lib.parse(ladder.get_config("rung=token_level_matched,base=testbed16"))
  dapo = config_lib.parse(ladder.get_config("rung=dapo,base=testbed16"))
  # as many prompts sampled a step as dapo's round, all trained on, 1 prompt per update as dapo
  assert m.prompts_per_round == dapo.prompts_per_round == m.train.batch_size == 24
  assert m.minibatch_prompts == dapo.minibatch_prompts == 1 and m.train.num_minibatches == 24
  assert not m.algo.dynamic_sampling
  old = config_lib.parse(ladder.get_config("rung=token_level_matched"))  # the first testbed
  assert (old.train.batch_size, old.train.num_minibatches, old.minibatch_prompts) == (24, 6, 4)
  assert m.algo.loss_agg == "token-mean" and m.algo.overlong_penalty
  runs = ladder.get_sweep("ladder16")
  assert len(runs) == 7 * len(ladder.SEEDS16) == len({r["name"] for r in runs})
  arms = [a for phase in ladder.LADDER16_PHASES for a in phase]
  assert sorted(arms) == sorted(ladder.RUNGS + ("token_level_matched",))
  first = ladder.LADDER16_PHASES[0]  # seed-major within a phase: a cut-short phase stays paired
  assert [r["name"] for r in runs[:2 * len(first)]] == [f"{a}_s{s}" for s in (0, 1) for a in first]
  pilots = ladder.get_sweep("pilot16")
  assert len(pilots) == len(ladder.PILOT_ARMS) * len(ladder.PILOT_SEEDS)
  assert [r["overrides"] for r in pilots[:len(ladder.PILOT_ARMS)]] == list(ladder.PILOT_ARMS.values())
  assert all("base=testbed16" in r["arg"] for r in runs + pilots)


# ---- architecture fields with model.source="hf" ----------------------------------------------


def test_lora_ranks_sweep_runs_each_rank_at_the_adapter_learning_rate():
  ladder = importlib.import_module("configs.ladder")
  runs = ladder.get_sweep("lora_ranks")
  assert [r["name"] for r in runs[:3]] == [f"lora_r{r}_s0" for r in ladder.LORA_RANKS]
  assert len(runs) == len(ladder.LORA_RANKS) * len(ladder.SWEEP_SEEDS)
  lr = ladder.get_config("rung=dapo").optim.lr
  assert {r["overrides"]["optim.lr"] for r in runs} == {ladder.LORA_LR_FACTOR * lr}
  c = ladder.get_config(runs[-1]["arg"])
  for path, v in runs[-1]["overrides"].items():
    section, key = path.split(".")
    c[section][key] = v
  assert config_lib.parse(c).lora.rank == ladder.LORA_RANKS[-1]  # the arm validates


def test_lora_lr_sweep_runs_each_rank_at_its_factor():
  ladder = importlib.import_module("configs.ladder")
  runs = ladder.get_sweep("lora_lr")
  lr = ladder.get_config("rung=dapo").optim.lr
  n = len(ladder.LORA_LR_ARMS)
  assert [(r["name"], r["overrides"]) for r in runs[:n]] == [
      (f"lora_r{k}_lr{f}x_s{ladder.SWEEP_SEEDS[0]}", {"lora.rank": k, "optim.lr": f * lr})
      for k, f in ladder.LORA_LR_ARMS]
  assert len(runs) == n * len(ladder.SWEEP_SEEDS)
