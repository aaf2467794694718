import dataclasses
import importlib
import os
import subprocess
import sys

import pytest

from configs import base as base_cfg
from dapo_jax import config as config_lib
from dapo_jax.core import losses as core_losses

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tiny(arg=None):
  return importlib.import_module("configs.tiny_cpu").get_config(arg)


@pytest.mark.parametrize("module, arg", [
    ("configs.tiny_cpu", None), ("configs.tiny_cpu", "runlocal=True"),
    ("configs.dapo_qwen25_32b", None), ("configs.dapo_qwen25_32b", "tpu=v5e-256"),
    ("configs.dapo_qwen25_32b", "tpu=v6e-32"), ("configs.dapo_qwen25_32b", "tpu=v6e-64"),
    ("configs.dapo_qwen25_32b", "lora=True,tpu=v5p-8"),
    ("configs.dapo_qwen25_32b", "lora=True,tpu=v6e-8"), ("configs.smollm2_cpu", "lora=True"),
    ("configs.ladder", "rung=naive_grpo"),
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


def test_paper_recipe_slice_settings():
  """tpu=SLICE: the settings its compile fitted (docs/scale.md); the recipe's maths unchanged."""
  mod = importlib.import_module("configs.dapo_qwen25_32b")
  c = config_lib.parse(mod.get_config("tpu=v5e-256"))
  assert (c.mesh.context, c.mesh.tensor, c.train.micro_batch_size) == (4, 4, 16)
  assert (c.rollout.weight_dtype, c.rollout.kv_cache_gib) == ("int8", 4.0)
  assert c.algo == config_lib.parse(mod.get_config()).algo
  with pytest.raises(ValueError, match="tpu: 'v6e-8' has no fitted settings"):
    mod.get_config("tpu=v6e-8")
  lo = config_lib.parse(mod.get_config("lora=True,tpu=v5p-8"))  # LoRA: its own slices
  assert (lo.lora.rank, lo.model.param_dtype, lo.optim.lr) == (32, "bfloat16", 1e-5)
  assert lo.algo == c.algo and lo.train.micro_batch_size == 1
  with pytest.raises(ValueError, match="tpu: 'v5p-8' has no fitted settings"):
    mod.get_config("tpu=v5p-8")  # full weights do not fit one host
  v6 = config_lib.parse(mod.get_config("lora=True,tpu=v6e-8"))
  assert (v6.mesh.context, v6.mesh.tensor, v6.rollout.num_slots) == (2, 4, 256)


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
    ("rollout.steps_per_call", 0, "rollout.steps_per_call"),
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


@pytest.mark.parametrize("path, value, msg", [
    ("seed", -1, "config.seed"), ("checkpoint.every_steps", -1, "checkpoint.every_steps"),
    ("eval.every_steps", -2, "eval.every_steps"), ("eval.num_problems", -5, "eval.num_problems"),
    ("task.num_train", -3, "task.num_train"), ("train.micro_batch_size", 0, "micro_batch_size"),
    ("algo.loss_mode", "ppo", "algo.loss_mode"), ("algo.loss_agg", "sum", "algo.loss_agg"),
    ("algo.mode_params.sapo.tau_pos", 0.0, "algo.mode_params.sapo.tau_pos"),
    ("algo.mode_params.kl_cov.kl_coef", -1.0, "algo.mode_params.kl_cov.kl_coef"),
    ("algo.is_correction", "tis", "algo.is_correction"),
    ("algo.is_cap", 1.0, "algo.is_cap"), ("algo.loss_scale_factor", -1.0, "loss_scale_factor"),
    ("optim.b1", 1.0, "optim.b1"), ("optim.eps", 0.0, "optim.eps"),
    ("warm_start.batch_size", 0, "warm_start.batch_size"), ("algo.adv_eps", -1e-6, "adv_eps"),
    ("algo.entropy_coef", -0.1, "entropy_coef"), ("train.entropy_ceiling", 0.0, "entropy_ceiling"),
    ("distributed.process_id", -2, "distributed.process_id"),
    ("distributed.num_processes", 0, "distributed.num_processes"),
])
def test_range_checks_name_the_field(path, value, msg):
  """Every field is range-checked at parse time, before JAX starts."""
  c = _tiny()
  if "." in path:
    *sections, key = path.split(".")
    node = c
    for name in sections:
      node = node[name]
    node[key] = value
  else:
    c[path] = value
  with pytest.raises(ValueError, match=msg):
    config_lib.parse(c)


def test_generation_budget_that_cannot_fill_a_batch_is_caught_up_front():
  c = _tiny()
  c.algo.update(gen_batch_size=4, max_gen_rounds=3, dynamic_sampling=True)  # 12 < 16 prompts
  with pytest.raises(ValueError, match=r"algo.max_gen_rounds: .* = 12 prompts can never fill"):
    config_lib.parse(c)
  c.algo.max_gen_rounds = 4
  config_lib.parse(c)


@pytest.mark.parametrize("rollout, msg", [(dict(top_p=0.9), "top_p=0.9"),
                                          (dict(top_k=20), "top_k=20")])
def test_sampler_logprobs_need_the_untruncated_distribution(rollout, msg):
  c = _tiny()
  c.algo.old_logp_source = "sampler"
  config_lib.parse(c)  # top_p = 1, top_k = 0: the sampler's log-probs are π_old's
  c.rollout.update(**rollout)
  with pytest.raises(ValueError, match=f"algo.old_logp_source: .*{msg}"):
    config_lib.parse(c)
  c = _tiny()
  c.algo.update(old_logp_source="sampler", is_correction="tis_token")
  with pytest.raises(ValueError, match="algo.is_correction"):
    config_lib.parse(c)


@pytest.mark.parametrize("algo, msg", [
    (dict(rollout_is="tokens"), "config.algo.rollout_is: 'tokens'; expected one of"),
    (dict(rollout_is="token", rollout_is_threshold="0"), "config.algo.rollout_is_threshold: .*> 0"),
    (dict(rollout_is="sequence", rollout_is_threshold="3_1"),
     "config.algo.rollout_is_threshold: .*lower bound above the upper"),
    (dict(rollout_rs="token_k4"), "config.algo.rollout_rs: .*unknown \\['token_k4'\\]"),
    (dict(rollout_rs="token_k2", rollout_rs_threshold="0.5_2"),
     "config.algo.rollout_rs_threshold: .*token_k2.*one upper bound"),
    (dict(rollout_rs="token_k1,seq_mean_k3", rollout_rs_threshold="2,0.1,3"),
     "config.algo.rollout_rs_threshold: .*one per option"),
    (dict(is_correction="tis_token", rollout_rs="token_k1"), "config.algo.rollout_is: .*set one"),
    (dict(old_logp_source="sampler", rollout_is="token"), "config.algo.is_correction: .*recompute"),
])
def test_rollout_correction_refusals_name_the_field(algo, msg):
  c = _tiny()
  c.algo.update(**algo)
  with pytest.raises(ValueError, match=msg):
    config_lib.parse(c)
  assert config_lib.parse(_tiny()).algo.corrects_off_policy() is False


def test_derived_properties():
  c = config_lib.parse(importlib.import_module("configs.dapo_qwen25_32b").get_config())
  assert c.seq_len == 2048 + 20480
  assert c.prompts_per_round == 1536 and c.minibatch_seqs == 32 * 16
  # seq-mean-token-sum-norm divides by the generation budget unless set.
  assert c.loss_scale_factor == 20480
  t = _tiny()
  t.algo.update(dynamic_sampling=False, loss_scale_factor=7.0)
  t = config_lib.parse(t)
  assert t.prompts_per_round == t.train.batch_size and t.loss_scale_factor == 7.0


def test_each_loss_knob_is_declared_once():
  """Every keyword of every loss mode is a shared AlgoCfg field or a knob of algo.mode_params
  (same name), so the train step reads the config directly; None = the paper default."""
  from dapo_jax.core.loss_modes import MODES  # pylint: disable=import-outside-toplevel
  base = config_lib.parse(_tiny())
  for mode, spec in MODES.items():
    a = dataclasses.replace(base.algo, loss_mode=mode)
    params = a.loss_params()
    assert set(spec.defaults) <= set(params), mode
    resolved = core_losses.resolve_params(mode, params)
    assert set(resolved) == set(spec.defaults), mode
  c = _tiny()
  c.algo.loss_mode = "sapo"
  c.algo.mode_params.sapo.tau_pos = 0.5
  a = config_lib.parse(c).algo
  assert core_losses.resolve_params("sapo", a.loss_params()) == dict(tau_pos=0.5, tau_neg=1.05)


def test_mode_params_hold_exactly_the_loss_knobs():
  d = _tiny().to_dict()
  d["algo"]["mode_params"]["sapo"]["tau_pos"] = "hot"  # (a ConfigDict refuses this assignment)
  with pytest.raises(ValueError, match="algo.mode_params.sapo.tau_pos: expected a number or None"):
    config_lib.parse(d)
  d = _tiny().to_dict()
  d["algo"]["mode_params"]["sapo"]["tau_zero"] = 1.0
  with pytest.raises(ValueError, match=r"algo.mode_params.sapo: unknown knob\(s\) \['tau_zero'\]"):
    config_lib.parse(d)
  d = _tiny().to_dict()
  del d["algo"]["mode_params"]["kl_cov"]["kl_coef"]
  with pytest.raises(ValueError, match=r"algo.mode_params.kl_cov: missing knob\(s\) \['kl_coef'\]"):
    config_lib.parse(d)
  d = _tiny().to_dict()
  d["algo"]["mode_params"]["ppo"] = {}
  with pytest.raises(ValueError, match=r"algo.mode_params: unknown loss mode\(s\) \['ppo'\]"):
    config_lib.parse(d)
  hash(config_lib.parse(_tiny()).algo)  # the section stays hashable


def test_optional_fields_accept_none_or_their_type():
  c = _tiny()
  c.train.micro_batch_size = 64
  assert config_lib.parse(c).train.micro_batch_size == 64
  d = _tiny().to_dict()
  d["train"]["micro_batch_size"] = 2.5
  with pytest.raises(ValueError, match="train.micro_batch_size: expected an int"):
    config_lib.parse(d)


@pytest.mark.parametrize("field, value", [("num_layers", 4), ("hidden_size", 1024),
                                          ("tie_word_embeddings", True), ("rope_theta", 1e4)])
def test_hf_source_refuses_architecture_overrides(field, value):
  """The 32B config takes its 64 layers from the checkpoint: a command-line architecture field
  would be ignored, so it is refused, naming the field."""
  c = importlib.import_module("configs.dapo_qwen25_32b").get_config()
  c.model[field] = value
  with pytest.raises(ValueError, match=rf"config\.model\.{field}: set on the command line, but "
                     r"model\.source='hf'"):
    config_lib.parse(c, {f"model.{field}": value})


def test_architecture_overrides_allowed_where_they_act():
  # A fresh model (source="config") is built from these fields; run settings and vocab_size
  # (compared with the checkpoint's when the model is built) are not architecture to refuse.
  c = importlib.import_module("configs.dapo_qwen25_32b").get_config()
  c.model.source = "config"
  c.model.num_layers = 4
  parsed = config_lib.parse(c, {"model.source": "config", "model.num_layers": 4})
  assert parsed.model.num_layers == 4
  hf = importlib.import_module("configs.dapo_qwen25_32b").get_config()
  config_lib.parse(hf, {"model.remat": False, "model.vocab_size": 0, "train.num_steps": 3})


def test_main_refuses_hf_architecture_override(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  p = subprocess.run([sys.executable, "-m", "dapo_jax.main", "--config=configs/dapo_qwen25_32b.py",
                      "--config.model.num_layers=4", f"--workdir={tmp_path / 'run'}"],
                     cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert p.returncode != 0
  assert "config.model.num_layers: set on the command line" in p.stdout + p.stderr, p.stderr[-2000:]
