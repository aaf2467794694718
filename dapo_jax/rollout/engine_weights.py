"""The engine's own copy of the policy's weights on its mesh (`EngineWeights`).

Two parts: the synced weights, which every weight sync replaces (`load`), and the held ones, set
once at construction. A full-weight policy syncs its nnx.Param state (in the engine's weight
dtype; int8: quantised here at every load) and holds nothing else of size. A LoRA policy
(models/lora.py) syncs only its adapters (kept in the compute dtype: a sync moves adapter bytes)
and holds the frozen base, placed (and int8-quantised) once; decode applies the adapters per
projection (`layers.dense` of a `lora.LoraWeight`) instead of merging them into a second copy of
the base. A trainer that donates its own buffers can never delete the engine's copies.
"""
import jax
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from dapo_jax import sharding as sharding_lib
from dapo_jax.models import lora, quant
from dapo_jax.rollout import transfer


class EngineWeights:
  """`model`'s weights on `mesh` (see the module docstring); `graphdef` merges them back."""

  def __init__(self, model, mesh, weight_dtype: str):
    self.weight_dtype = weight_dtype
    shardings = sharding_lib.model_shardings(model, mesh)
    compute = quant.storage_dtype("auto", model.cfg.dtype)
    self._dtype = quant.storage_dtype(weight_dtype, model.cfg.dtype)
    if lora.has_adapters(model):
      self.graphdef, synced, rest = nnx.split(model, lora.LoraParam, ...)
      self._sync_shardings, rest_sh = nnx.split_state(shardings, lora.LoraParam, ...)
      self._sync_dtype, self._quantize_sync = compute, False
      self.rest = self._place(rest, rest_sh, self._dtype, weight_dtype == "int8")
    else:
      self.graphdef, synced, rest = nnx.split(model, nnx.Param, ...)
      self._sync_shardings = transfer.param_shardings(model, mesh)
      self._sync_dtype, self._quantize_sync = self._dtype, weight_dtype == "int8"
      self.rest = jax.device_put(rest, NamedSharding(mesh, PartitionSpec()), may_alias=False)
    self._like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), synced)
    self._synced = self._placed(synced)

  @staticmethod
  def _place(tree, shardings, dtype, quantize: bool):
    placed = transfer.transfer_params(tree, shardings, dtype)
    # int8: quantised on the engine's devices, the compute-dtype copy dropped on return
    return quant.quantize_params(placed, shardings) if quantize else placed

  def _placed(self, synced):
    return self._place(synced, self._sync_shardings, self._sync_dtype, self._quantize_sync)

  @property
  def synced(self):
    if self._synced is None:
      raise RuntimeError("the sampler's weights were released for the update "
                         "(Engine.release_params); the weight sync (load_params) puts them back")
    return self._synced

  def release(self) -> None:
    """Deletes the synced weights (the held base of a LoRA policy stays)."""
    old, self._synced = self._synced, None
    if old is not None:
      jax.tree.map(lambda x: x.delete(), old)

  def load(self, params, *, free_old: bool):
    """`params` (the trainer's synced state, or a pure dict of its tree, on any mesh) checked
    against the engine's and moved device to device onto its mesh; free_old: delete the old
    copy first. Returns them."""
    matched = transfer.match_tree(params, self._like)
    if free_old:
      self.release()
    self._synced = self._placed(matched)
    return self._synced

  def sync_bytes(self) -> int:
    """Bytes one weight sync moves (in the engine's layout: the adapters alone under LoRA)."""
    return quant.weight_bytes(self.synced)
