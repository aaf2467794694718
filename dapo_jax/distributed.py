"""Multi-host start-up: jax.distributed from the config or the environment."""
import jax


def initialize(dcfg) -> None:
  """Calls jax.distributed.initialize when config.distributed.enabled.

  On TPU pods every argument may be left unset ("" / -1): JAX finds the coordinator itself. On
  CPU (tests, local multi-process runs) set coordinator_address, num_processes, process_id and
  cpu_collectives="gloo" so cross-process collectives work.
  """
  if not dcfg.enabled:
    return
  if dcfg.cpu_collectives:
    jax.config.update("jax_cpu_collectives_implementation", dcfg.cpu_collectives)
  kwargs = {}
  if dcfg.coordinator_address:
    kwargs["coordinator_address"] = dcfg.coordinator_address
  if dcfg.num_processes >= 0:
    kwargs["num_processes"] = dcfg.num_processes
  if dcfg.process_id >= 0:
    kwargs["process_id"] = dcfg.process_id
  jax.distributed.initialize(**kwargs)
