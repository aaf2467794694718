"""A LoRA policy's adapters in PEFT's format: `<out>/adapter_config.json` and
`<out>/adapter_model.safetensors`, loadable with `peft.PeftModel.from_pretrained(base, out)` onto
the HF checkpoint `base_model_name_or_path` names (tests/test_lora_peft.py checks the logits)."""
import json
import os

import jax
import numpy as np

from dapo_jax.models import hf_io
from dapo_jax.models.lora import MLP_TARGETS, TARGETS
from dapo_jax.workdir import paths, remote_safetensors

CONFIG_FILE, WEIGHTS_FILE = "adapter_config.json", "adapter_model.safetensors"


def adapter_arrays(model) -> dict:
  """{PEFT tensor name: host float32 array} of `model`'s adapters in PEFT's layout, lora_A
  [r, in] and lora_B [out, r] per layer, keyed as `peft.get_peft_model_state_dict` writes
  (every process gathers; the arrays may span hosts)."""
  layers, cfg = model.layers, model.cfg
  by_ours = {ours: (t, in_dims) for t, (ours, in_dims) in TARGETS.items()}
  out = {}
  for name in layers.lora_targets:
    t = by_ours[name][0]
    a = hf_io.to_host(getattr(layers, f"lora_a_{name}").get_value()).astype(np.float32)
    b = hf_io.to_host(getattr(layers, f"lora_b_{name}").get_value()).astype(np.float32)
    rows = cfg.dense_layers if t in MLP_TARGETS else range(cfg.num_layers)
    part = "mlp" if t in MLP_TARGETS else "self_attn"
    r = a.shape[-1]
    for j, i in enumerate(rows):
      stem = f"base_model.model.model.layers.{i}.{part}.{t}"
      out[f"{stem}.lora_A.weight"] = np.ascontiguousarray(a[j].reshape(-1, r).T)
      out[f"{stem}.lora_B.weight"] = np.ascontiguousarray(b[j].reshape(r, -1).T)
  return out


def peft_config(model, *, rank: int, alpha: float, base_path: str) -> dict:
  """adapter_config.json's fields (PEFT's LoraConfig)."""
  by_ours = {ours: t for t, (ours, _) in TARGETS.items()}
  return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_path,
          "r": int(rank), "lora_alpha": float(alpha), "lora_dropout": 0.0, "bias": "none",
          "target_modules": sorted(by_ours[n] for n in model.layers.lora_targets),
          "fan_in_fan_out": False, "use_rslora": False, "init_lora_weights": True,
          "inference_mode": True, "modules_to_save": None}


def write_adapter(model, lora_cfg, base_path: str, out: str) -> None:
  """The adapters of `model` (with lora_cfg's rank and alpha) to `out` in PEFT's format;
  base_path: the base's HF directory (made absolute when local). Process 0 writes."""
  tensors = adapter_arrays(model)
  if jax.process_index() != 0:
    return
  base = base_path if paths.is_url(base_path) else os.path.abspath(base_path)
  with paths.staged_dir(out) as local:
    remote_safetensors.save_file(tensors, os.path.join(local, WEIGHTS_FILE),
                                 metadata={"format": "pt"})
    with open(os.path.join(local, CONFIG_FILE), "w") as f:
      json.dump(peft_config(model, rank=lora_cfg.rank, alpha=lora_cfg.alpha, base_path=base),
                f, indent=2)
  print(f"[export] LoRA adapter (PEFT): {out}")
