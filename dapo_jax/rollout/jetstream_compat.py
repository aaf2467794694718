"""Imports google-jetstream 0.2.2's orchestrator under current JAX.

Why this module exists: jetstream 0.2.2's orchestrator frees each prefix after inserting it with
`jax.tree_map`, which JAX removed (it is `jax.tree.map` now). Under current JAX the generate
thread dies on the first insert with an AttributeError, JetStream's JetThread then SIGKILLs the
process or, in tests, requests hang. The two functions are the same map over a pytree, so one
alias, set before the orchestrator runs, makes JetStream's own Driver work unchanged. Nothing else
in dapo_jax uses the alias. `jetstream.engine.engine_api` needs no alias and imports normally.
"""
import logging

import jax


def ensure_tree_map_alias() -> None:
  """Sets `jax.tree_map = jax.tree.map` if this JAX no longer has it (idempotent)."""
  if not hasattr(jax, "tree_map"):
    jax.tree_map = jax.tree.map


def import_orchestrator():
  """Returns `jetstream.core.orchestrator` with the alias set and the root logger left alone.

  The orchestrator configures the root logger at import (level DEBUG, a stdout handler), which
  would print a line per generate step of every later program; we restore what was there.
  """
  ensure_tree_map_alias()
  root = logging.getLogger()
  level, handlers = root.level, list(root.handlers)
  from jetstream.core import orchestrator  # pylint: disable=g-import-not-at-top
  root.setLevel(level)
  for h in list(root.handlers):
    if h not in handlers:
      root.removeHandler(h)
  return orchestrator
