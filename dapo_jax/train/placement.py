"""Which devices train and which sample: the trainer's mesh, the sampler's mesh, and the split.

`colocated` (the default): both roles use every device and take turns. `split`
(`rollout.placement`): the sampler owns `rollout.sampler_devices` of them (a count, or a
fraction of all devices) and the trainer the rest, so a rollout can run while an update does
(train/pipeline.py). With several processes every host gives the same number of its own devices
to each role: the last ones of each host sample, the others train; each host's sampler is its
own (its slice of the prompts), the trainer's mesh spans every host.
"""
import dataclasses

import jax

from dapo_jax import sharding
from dapo_jax.config import Config


@dataclasses.dataclass(frozen=True)
class Placement:
  trainer: tuple        # the trainer's devices (every process's, in jax.devices() order)
  sampler: tuple        # the sampler's devices (every process's)

  @property
  def split(self) -> bool:
    return not set(self.trainer) & set(self.sampler)

  def local_sampler(self) -> list:
    """This process's sampler devices (its own sampler's mesh)."""
    return [d for d in self.sampler if d.process_index == jax.process_index()]


def frees_sampler_weights(cfg: Config) -> bool:
  """Whether the sampler's copy of the weights is deleted for the update: in the synchronous
  loop (rollout.max_staleness = 0) of the colocated placement its chips are the update's and
  nothing samples until the weight sync, which refills the copy (train/trainer.py)."""
  return cfg.rollout.placement == "colocated" and cfg.rollout.max_staleness == 0


def sampler_device_count(cfg: Config, total: int) -> int:
  """rollout.sampler_devices as a count of `total` devices (a fraction is rounded)."""
  n = cfg.rollout.sampler_devices
  count = int(n) if n >= 1 else int(round(n * total))
  if not 1 <= count < total:
    raise ValueError(f"config.rollout.sampler_devices: {n} gives the sampler {count} of "
                     f"{total} devices; a split needs at least one device for each role")
  return count


def place(cfg: Config, devices=None) -> Placement:
  """The run's placement over `devices` (default: every device of every process)."""
  devices = tuple(jax.devices() if devices is None else devices)
  if cfg.rollout.placement == "colocated":
    return Placement(trainer=devices, sampler=devices)
  hosts = sorted({d.process_index for d in devices})
  count = sampler_device_count(cfg, len(devices))
  if count % len(hosts):
    raise ValueError(f"config.rollout.sampler_devices: {count} sampler devices do not split "
                     f"evenly over {len(hosts)} processes")
  per_host = count // len(hosts)
  trainer, sampler = [], []
  for h in hosts:
    local = [d for d in devices if d.process_index == h]
    trainer += local[:len(local) - per_host]
    sampler += local[len(local) - per_host:]
  return Placement(trainer=tuple(trainer), sampler=tuple(sampler))


def build_mesh(cfg: Config, devices=None):
  """The trainer's mesh (data x fsdp x tensor, config.mesh) over `devices`, with a context axis
  between fsdp and tensor when mesh.context > 1 (context parallelism, dapo_jax/sharding.py)."""
  mesh = cfg.mesh
  axes = {"data": mesh.data, "fsdp": mesh.fsdp}
  if mesh.context > 1:
    axes[sharding.CONTEXT] = mesh.context
  axes["tensor"] = mesh.tensor
  try:
    return sharding.make_mesh(axes, devices)
  except ValueError as err:
    raise ValueError(f"config.mesh: {err}") from None


def build_sampler_mesh(cfg: Config, devices=None):
  """The sampler's mesh (replicas x tensor parallel): weights are replicated over `data` and
  split over `tensor` (never FSDP-gathered per decode step); slots split over `data`. With
  several processes the data axis runs host-major, so each host's slice of it is that host's
  own sampler (engine.load_params fills it device-to-device)."""
  devices = jax.devices() if devices is None else devices
  try:
    return sharding.make_mesh({"data": -1, "fsdp": 1, "tensor": cfg.mesh.tensor}, devices)
  except ValueError as err:
    where = "rollout.sampler_devices" if cfg.rollout.placement == "split" else "mesh.tensor"
    raise ValueError(f"config.{where}: sampler mesh: {err}") from None
