"""Checks of config.lora (LoRA adapters, models/lora.py) before anything is built.

What needs the model (a rank larger than a projection, MLP targets on a MoE model) is refused
by `models.lora.attach` when the run builds the policy, still before anything compiles.
"""
# models/lora.TARGETS's names (not imported: a config error must not wait for flax; a test
# holds the two equal)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
_MLP = ("gate_proj", "up_proj", "down_proj")


def validate_lora(c) -> None:
  """rank an int >= 0; with adapters: alpha > 0, targets known, no MLP target on a MoE model
  built from the config (an HF checkpoint's experts are checked at build)."""
  lo = c.lora
  if isinstance(lo.rank, bool) or not isinstance(lo.rank, int) or lo.rank < 0:
    raise ValueError(f"config.lora.rank: must be an int >= 0 (0 = full-weight training), got "
                     f"{lo.rank!r}")
  if lo.rank == 0:
    return
  if not lo.alpha > 0:
    raise ValueError(f"config.lora.alpha: must be > 0, got {lo.alpha}")
  targets = [t.strip() for t in lo.targets.split(",") if t.strip()]
  unknown = sorted(set(targets) - set(LORA_TARGETS))
  if unknown or not targets:
    raise ValueError(f"config.lora.targets: unknown {unknown or 'empty list'} in "
                     f"{lo.targets!r}; known: {list(LORA_TARGETS)}")
  mlp = sorted(set(targets) & set(_MLP))
  if mlp and c.model.source == "config" and c.model.num_experts:
    raise ValueError(f"config.lora.targets: {mlp} on a MoE model (model.num_experts="
                     f"{c.model.num_experts}): expert weights are not adapted; target the "
                     "attention projections q_proj,k_proj,v_proj,o_proj")
