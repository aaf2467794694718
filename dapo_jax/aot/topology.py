"""The TPU slices the AOT check knows: chip HBM, chip grid and host layout, in one table.

Names follow Cloud TPU: v4-N and v5p-N count TensorCores (2 per chip, one megacore device per
chip), v5e-N and v6e-N count chips (one core each). `devices(name)` returns compile-only TPU
devices from libtpu (`jax.experimental.topologies`); nothing needs to be attached.
"""
import dataclasses

GiB = 1024 ** 3


@dataclasses.dataclass(frozen=True)
class Generation:
  prefix: str                  # libtpu topology prefix ("v5p" -> "v5p:4x4x4")
  chip_config: str             # "megacore" = one device per chip on the 2-core chips
  hbm_gib: float               # HBM per chip
  cores_per_chip: int          # how the user-facing N counts: TensorCores (2) or chips (1)
  grids: dict                  # chips -> chip grid
  host_bounds: tuple           # chips per host (x, y, z) for multi-host slices
  single_host_chips: int       # slices up to this many chips sit on one host
  peak_bf16_tflops: float      # per chip, dense bf16 (the cost model's own figure is used
  hbm_tb_s: float              # for times; these two are for the roofline note only)


_GRID_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
            256: "4x8x8", 512: "8x8x8", 1024: "8x8x16"}
_GRID_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
            256: "16x16"}

GENERATIONS = {
    "v4": Generation("v4", "megacore", 32, 2, _GRID_3D, (2, 2, 1), 4, 275, 1.2),
    "v5p": Generation("v5p", "default", 95, 2, _GRID_3D, (2, 2, 1), 4, 459, 2.76),
    "v5e": Generation("v5e", "default", 16, 1, _GRID_2D, (2, 2, 1), 8, 197, 0.82),
    "v6e": Generation("v6e", "default", 32, 1, _GRID_2D, (2, 2, 1), 8, 918, 1.64),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  name: str                    # "v5p-128"
  gen: Generation
  chips: int
  grid: str                    # "4x4x4"

  @property
  def hbm_bytes(self) -> int:
    return int(self.gen.hbm_gib * GiB)

  @property
  def hosts(self) -> int:
    if self.chips <= self.gen.single_host_chips:
      return 1
    per = self.gen.host_bounds[0] * self.gen.host_bounds[1] * self.gen.host_bounds[2]
    return self.chips // per

  @property
  def host_bounds(self) -> tuple:
    if self.hosts == 1:  # one host holds the whole grid
      dims = [int(x) for x in self.grid.split("x")]
      return tuple(dims + [1] * (3 - len(dims)))
    return self.gen.host_bounds


def known_names() -> list[str]:
  return [f"{g}-{c * gen.cores_per_chip}" for g, gen in GENERATIONS.items() for c in gen.grids]


def parse(name: str) -> Slice:
  """'v5p-128' -> Slice; an unknown generation or size is an error listing what is known."""
  gen_name, _, n = name.partition("-")
  gen = GENERATIONS.get(gen_name)
  if gen is None or not n.isdigit():
    raise ValueError(f"--topology: unknown TPU slice {name!r}; expected GEN-N with GEN one of "
                     f"{sorted(GENERATIONS)}, e.g. v5p-128 (known: {', '.join(known_names())})")
  cores = int(n)
  chips = cores // gen.cores_per_chip
  if cores % gen.cores_per_chip or chips not in gen.grids:
    sizes = [c * gen.cores_per_chip for c in gen.grids]
    raise ValueError(f"--topology: {name!r} is not a {gen_name} slice size; known sizes: "
                     f"{sizes}")
  return Slice(name=name, gen=gen, chips=chips, grid=gen.grids[chips])


def devices(s: Slice) -> list:
  """Compile-only devices of the slice (needs libtpu; run with JAX_PLATFORMS=cpu)."""
  try:
    from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
    desc = topologies.get_topology_desc(
        platform="tpu", topology_name=f"{s.gen.prefix}:{s.grid}", chip_config_name=s.gen.chip_config,
        chips_per_host_bounds=s.host_bounds, num_slices=1)
  except Exception as err:  # pylint: disable=broad-except
    raise RuntimeError(f"--topology={s.name}: libtpu could not describe {s.gen.prefix}:{s.grid} "
                       f"({err}); install the dev requirements (libtpu) and set "
                       "JAX_PLATFORMS=cpu") from err
  devs = list(desc.devices)
  if len(devs) != s.chips:
    raise RuntimeError(f"--topology={s.name}: libtpu gave {len(devs)} devices, expected "
                       f"{s.chips} chips")
  return devs


def one_host(s: Slice) -> Slice:
  """A slice of one host of `s`'s generation with that host's chip grid (v6e-256 -> v6e-4, a
  2x2 grid): the chips a per-host sampler replica runs on, as a topology of their own."""
  x, y, z = s.host_bounds
  chips = x * y * z
  if s.hosts == 1:
    return s
  return Slice(name=f"{s.gen.prefix}-{chips * s.gen.cores_per_chip}", gen=s.gen, chips=chips,
               grid=s.gen.grids[chips])
