"""A LoRA run end to end (config.lora.rank > 0, train/adapters.py): checkpoints hold the adapters
and their optimizer state only, resume bitwise against the base written beside them, refuse a
different base, and export in PEFT's format, which peft loads onto the base in torch with the
merged export's logits; the split asynchronous loop syncs the adapters to the sampler's devices."""
import json
import os

import jax
import numpy as np
import pytest

from dapo_jax import job
from dapo_jax.refusals import Refusal
from dapo_jax.train import trainer
from tests.test_trainer import _records, fake_rewards, tiny_config  # noqa: F401 (fixture)

FAST = {"optim.lr": 3e-2, "optim.warmup_steps": 0}
LORA = {"lora.rank": 2, "lora.alpha": 8.0}


def _run(workdir, resume=False, **overrides):
  run = trainer.build(tiny_config(**{**FAST, **overrides}), str(workdir), resume=resume)
  return run, trainer.train(run, resume=resume)


def _bytes(directory) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(directory) for f in fs)


def test_lora_checkpoints_hold_adapters_and_resume_bitwise(tmp_path):
  steps4 = {**LORA, "train.num_steps": 4, "checkpoint.every_steps": 2}
  full, _ = _run(tmp_path / "full", **steps4)
  assert os.path.exists(tmp_path / "full" / "base" / "config.json")  # a fresh init's base
  recs = _records(tmp_path / "full")
  assert all(r["weight_sync_bytes"] == full.sampler.engine.sync_bytes() for r in recs)
  assert {r["updates_skipped"] for r in recs} == {0.0} and recs[0]["grad_norm"] > 0
  _run(tmp_path / "split", **{**steps4, "train.num_steps": 2})
  resumed, _ = _run(tmp_path / "split", resume=True, **steps4)
  assert _records(tmp_path / "full") == _records(tmp_path / "split")
  for a, b in zip(jax.tree.leaves(full.loop.state), jax.tree.leaves(resumed.loop.state)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  names = {str(p) for p, _ in jax.tree_util.tree_flatten_with_path(full.loop.state.params)[0]}
  assert names and all("lora_" in n for n in names)  # the optimizer trains the adapters only
  # Same config without adapters: what its checkpoint saves against the LoRA run's (the
  # directories also hold orbax's per-array metadata, ~40 kB at any size).
  dense, _ = _run(tmp_path / "dense", **{**steps4, "lora.rank": 0})
  nbytes = lambda run: sum(x.nbytes for x in jax.tree.leaves(run.loop.state))  # noqa: E731
  assert nbytes(full) < 0.25 * nbytes(dense)
  ckpt = lambda w: _bytes(tmp_path / w / "checkpoints" / "4")  # noqa: E731
  assert ckpt("full") < 0.5 * ckpt("dense")


def test_resume_refuses_another_base_or_rank(tmp_path):
  _run(tmp_path / "w", **LORA)
  base = tmp_path / "w" / "base"
  with pytest.raises(Refusal, match="saved with LoRA adapters and this run's config.lora.rank"):
    _run(tmp_path / "w", resume=True, **{**LORA, "lora.rank": 0})
  from safetensors import numpy as st  # pylint: disable=import-outside-toplevel
  tensors = st.load_file(str(base / "model.safetensors"))
  name = next(n for n in tensors if n.endswith("q_proj.weight"))
  tensors[name] = tensors[name] + np.float32(1e-3)
  st.save_file(tensors, str(base / "model.safetensors"), metadata={"format": "pt"})
  with pytest.raises(Refusal, match="base weights at .* differ from those the checkpoint's"):
    _run(tmp_path / "w", resume=True, **{**LORA, "train.num_steps": 3})


def test_peft_loads_the_exported_adapter_with_the_merged_logits(tmp_path):
  import torch  # pylint: disable=import-outside-toplevel
  from peft import PeftModel  # pylint: disable=import-outside-toplevel
  from transformers import AutoModelForCausalLM  # pylint: disable=import-outside-toplevel
  run, _ = _run(tmp_path, **LORA)
  job.export(run, str(tmp_path / "export"))  # what a finished run writes (checkpoint.export_hf)
  adapter = tmp_path / "export" / "adapter"
  conf = json.loads((adapter / "adapter_config.json").read_text())
  assert conf["base_model_name_or_path"] == str(tmp_path / "base") and conf["r"] == 2
  assert sorted(conf["target_modules"]) == sorted(
      "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj".split(","))
  load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()  # noqa
  base = load(conf["base_model_name_or_path"])
  ids = torch.tensor(np.random.default_rng(0).integers(0, base.config.vocab_size, (2, 12)))
  with torch.no_grad():
    plain = base(ids).logits.numpy()
    peft_logits = PeftModel.from_pretrained(base, str(adapter)).eval()(ids).logits.numpy()
    merged = load(str(tmp_path / "export"))(ids).logits.numpy()
  assert np.abs(peft_logits - plain).max() > 1e-3  # the trained adapters act
  np.testing.assert_allclose(peft_logits, merged, atol=1e-4, rtol=0)


def test_the_split_asynchronous_loop_syncs_the_adapters_across_devices(tmp_path):
  """The sampler on its own devices, one version of staleness, partial rollouts: the engine ends
  with the trainer's last adapters on the sampler's devices, and the base stays where it was
  placed once (a sync never moves it)."""
  run, _ = _run(tmp_path, **LORA, **{
      "rollout.placement": "split", "rollout.sampler_devices": 4.0, "rollout.max_staleness": 1,
      "rollout.partial": True, "algo.is_correction": "tis_token", "train.num_steps": 3})
  engine, sampler_devices = run.sampler.engine, set(run.sampler.engine.mesh.devices.flat)
  assert not set(run.mesh.devices.flat) & sampler_devices
  base_before = [id(x) for x in jax.tree.leaves(engine._rest)]  # pylint: disable=protected-access
  trained, synced = jax.tree.leaves(run.loop.state.params), jax.tree.leaves(engine.params)
  assert len(trained) == len(synced) > 0
  for a, b in zip(trained, synced):
    assert b.devices() <= sampler_devices
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a, b.dtype))
  assert [r["staleness_max"] for r in _records(tmp_path)] == [0.0, 1.0, 1.0]
  run.sampler.update_params(run.loop.state.params, version=run.loop.step)
  assert [id(x) for x in jax.tree.leaves(engine._rest)] == base_before  # pylint: disable=protected-access
