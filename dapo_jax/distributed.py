"""Multi-host start-up (jax.distributed from the config or the environment) and fatal faults."""
import math
import os
import sys
import threading
import time

import jax

from dapo_jax import refusals
from dapo_jax.workdir import lock as run_lock

HEARTBEAT_S = 20  # seconds without a heartbeat before a process counts as dead
FINISH_S = 3600  # seconds a finished process waits for the others (process 0 writes the export)
LEAVE_S = 60  # then seconds process 0 waits for the others to disconnect
_finishing = threading.Event()  # set by finish(): peers leaving is then no fault


def cpu_devices_for_mesh(cfg) -> int | None:
  """A single-process run whose mesh names more devices than the CPU backend's default 1 (e.g.
  `--config.mesh.context=2` on a laptop) gets that many CPU devices (jax_num_cpu_devices; it
  changes nothing on an accelerator, whose devices the mesh uses). Left alone when
  XLA_FLAGS already sets the count, or several processes run. Returns the count set, or None."""
  m = cfg.mesh
  need = math.prod(n for n in (m.data, m.fsdp, m.tensor, m.context) if n != -1)
  if (need <= 1 or cfg.distributed.enabled
      or "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", "")):
    return None
  jax.config.update("jax_num_cpu_devices", need)
  return need


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
  # A dead process is declared after HEARTBEAT_S without heartbeats (JAX's default: 100 s); the
  # watchdog then ends this one, even if it waits in a collective that never returns. With
  # recoverability on, the coordination service reports the loss instead of aborting every
  # process itself: otherwise its abort races this process's last line naming the lost peer
  # (seen: aborted while fault_line waited on get_live_nodes), and the line is the contract.
  jax.config.update("jax_enable_recoverability", True)
  jax.distributed.initialize(heartbeat_timeout_seconds=HEARTBEAT_S, **kwargs)
  threading.Thread(target=_watchdog, name="dapo_jax_peer_watchdog", daemon=True).start()


def _watchdog(poll_s: float = 5.0) -> None:
  """Ends the process with a last line naming the lost process(es), once the coordination
  service reports one (two polls in a row, so one slow answer is no death)."""
  misses = 0
  while True:
    time.sleep(poll_s)
    if _finishing.is_set():
      return
    lost = lost_processes()
    misses = misses + 1 if lost != [] else 0
    if misses >= 2:
      who = ("the coordinator (process 0) is unreachable" if lost is None else
             f"lost process(es) {lost} (no heartbeat for {HEARTBEAT_S} s)")
      _exit(f"error: process {jax.process_index()} of {jax.process_count()} stopped: {who}. "
            f"Restart every process with --resume")


def finish(wait_s: float = FINISH_S, leave_s: float = LEAVE_S) -> None:
  """A multi-process run's orderly end, called by every process once its job succeeded.

  With recoverability on, JAX's own shutdown barrier no longer waits for the peers (the
  coordination service warns so at start-up), so process 0 could stop the service while a peer
  still sends its last shutdown call, and that peer aborts (exit -6 after a finished run, seen in
  a 2-process test on 2026-12-07). Here every process meets at a barrier (up to `wait_s`: process
  0 may still be writing the export; the watchdog still names a peer lost meanwhile), the others
  disconnect first, and process 0 stops the service once they have (or after `leave_s`)."""
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel
  state = jax_distributed.global_state
  if state.client is None:
    return
  client, everyone = state.client, list(range(state.num_processes))
  try:
    client.wait_at_barrier("dapo_jax_finish", int(wait_s * 1000))
  except Exception as e:  # pylint: disable=broad-except  # the job's outputs are written
    _exit(f"error: process {state.process_id} of {state.num_processes} finished its job, but "
          f"not every process reached the end within {wait_s:.0f} s "
          f"({refusals.one_line(str(e))[:200]})")
  _finishing.set()  # peers leaving from here on is the end, not a fault
  if state.process_id == 0:
    deadline = time.monotonic() + leave_s
    while len(client.get_live_nodes(everyone)) > 1 and time.monotonic() < deadline:
      time.sleep(0.05)
  jax.distributed.shutdown()


def lost_processes() -> list[int] | None:
  """Processes the coordination service no longer sees (None: the coordinator itself is gone)."""
  from jax._src import distributed as jax_distributed  # pylint: disable=import-outside-toplevel
  state = jax_distributed.global_state
  client = state.client
  if client is None:  # shut down (at exit): no peer to lose. jax.process_count() here would
    return []         # start a new CPU backend and abort the process (seen on 2026-12-03)
  everyone = list(range(state.num_processes))
  try:
    live = client.get_live_nodes(everyone)
  except Exception:  # pylint: disable=broad-except  # any failure here: no coordinator answers
    return None
  return [p for p in everyone if p not in live]


def fault_line(e: BaseException) -> str | None:
  """The last line for error `e`: a refusal a user can act on (refusals.error_line); in a
  multi-process run a lost peer comes first, and any other error is named with its process
  (a dead peer shows up as a failed collective). None: a bug in a one-process run (its
  traceback stays)."""
  own = refusals.error_line(e)
  if jax.process_count() == 1:
    return own
  lost = lost_processes()
  if own is not None and lost == []:
    return own
  who = ("the coordinator (process 0) is unreachable" if lost is None else
         f"lost process(es) {lost}" if lost else "no process reported lost yet")
  cause = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
  return (f"error: process {jax.process_index()} of {jax.process_count()} stopped: {who} "
          f"({type(e).__name__}: {cause}). Restart every process with --resume")


def _exit(line: str) -> None:
  run_lock.release_held()
  sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  os._exit(1)
