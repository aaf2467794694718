import importlib

import pytest

from configs import base as base_cfg
from dapo_jax import config as config_lib


def _tiny(arg=None):
  return importlib.import_module("configs.tiny_cpu").get_config(arg)


@pytest.mark.parametrize("module, arg", [
    ("configs.tiny_cpu", None), ("configs.tiny_cpu", "runlocal=True"),
    ("configs.dapo_qwen25_32b", None), ("configs.ladder", "rung=naive_grpo"),
    ("configs.ladder", "rung=dapo,seed=2"), ("configs.ladder", "rung=token_level,base=qwen25_32b"),
])
def test_shipped_configs_parse(module, arg):
  c = config_lib.parse(importlib.import_module(module).get_config(arg))
  assert c.rollout.group_size >= 2


def test_paper_recipe_values():
  c = config_lib.parse(importlib.import_module("configs.dapo_qwen25_32b").get_config())
  assert (c.train.batch_size, c.rollout.group_size, c.algo.gen_batch_size) == (512, 16, 1536)
  assert c.algo.max_gen_rounds == 10 and c.train.num_minibatches == 16
  assert c.minibatch_prompts == 32
  assert (c.optim.lr, c.optim.warmup_steps, c.optim.weight_decay, c.optim.grad_clip) == (
      1e-6, 20, 0.1, 1.0)
  assert (c.algo.eps_low, c.algo.eps_high, c.algo.clip_c) == (0.2, 0.28, 10.0)
  assert (c.rollout.max_new_tokens, c.algo.overlong_cache_len, c.task.max_prompt_len) == (
      20480, 4096, 2048)
  assert c.algo.kl_coef == 0.0 and c.eval.num_samples == 32 and c.eval.top_p == 0.7
  assert c.warmup_updates == 20 * 16  # warm-up counted in optimizer updates


def test_lock_rejects_typo():
  c = _tiny()
  c.lock()
  with pytest.raises(AttributeError):
    c.algo.eps_hihg = 0.3


@pytest.mark.parametrize("path, value, msg", [
    ("algo.eps_low", -0.1, "eps_low"), ("algo.eps_high", -0.1, "eps_high"),
    ("algo.clip_c", 0.5, "clip_c"), ("algo.loss_agg", "mean", "loss_agg"),
    ("rollout.group_size", 1, "group_size"), ("train.num_minibatches", 3, "num_minibatches"),
    ("algo.overlong_cache_len", 10_000, "overlong_cache_len"), ("rollout.top_p", 0.0, "top_p"),
    ("mesh.data", 0, "mesh.data"), ("train.micro_batch_size", 7, "micro_batch_size"),
    ("algo.kl_kind", "k9", "kl_kind"), ("rollout.temperature", 0.0, "temperature"),
    ("algo.gen_batch_size", 0, "gen_batch_size"), ("model.source", "hub", "model.source"),
])
def test_invalid_values_name_the_field(path, value, msg):
  c = _tiny()
  section, key = path.split(".")
  c[section][key] = value
  with pytest.raises(ValueError, match=msg):
    config_lib.parse(c)


def test_unknown_and_missing_keys():
  d = _tiny().to_dict()
  d["algo"]["eps_hihg"] = 0.3
  with pytest.raises(ValueError, match=r"config.algo: unknown key\(s\) \['eps_hihg'\]"):
    config_lib.parse(d)
  d = _tiny().to_dict()
  del d["train"]["batch_size"]
  with pytest.raises(ValueError, match="missing key"):
    config_lib.parse(d)
  d = _tiny().to_dict()
  d["extra"] = {}
  with pytest.raises(ValueError, match="unknown top-level"):
    config_lib.parse(d)


def test_wrong_types():
  c = _tiny()
  c.unlock()
  d = c.to_dict()
  d["train"]["batch_size"] = 16.0
  with pytest.raises(ValueError, match="train.batch_size: expected an int"):
    config_lib.parse(d)
  d = c.to_dict()
  d["algo"]["dynamic_sampling"] = 1
  with pytest.raises(ValueError, match="dynamic_sampling: expected a bool"):
    config_lib.parse(d)


def test_parse_arg():
  assert base_cfg.parse_arg("a=3,b=True", a=1, b=False) == {"a": 3, "b": True}
  with pytest.raises(ValueError, match="unknown option"):
    base_cfg.parse_arg("c=1", a=1)
  with pytest.raises(ValueError, match="key=value"):
    base_cfg.parse_arg("a", a=1)


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
  assert sorted({r["overrides"]["algo.eps_high"] for r in eps}) == [0.2, 0.24, 0.28, 0.32, 0.4]
  lc = ladder.get_sweep("l_cache")
  max_new = ladder.get_config().rollout.max_new_tokens
  assert sorted({r["overrides"]["algo.overlong_cache_len"] for r in lc}) == sorted(
      {int(round(f * max_new)) for f in (0, 0.125, 0.25, 0.5)})
  with pytest.raises(ValueError, match="unknown sweep"):
    ladder.get_sweep("nope")
