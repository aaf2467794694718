"""A persistent JAX compilation cache for one test module: several tiny runs in one process
compile once (each `build` jits new functions, which the in-memory cache does not share)."""
import contextlib

import jax
from jax._src import compilation_cache  # reset_cache: the cache's on/off is decided once

_SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_persistent_cache_min_entry_size_bytes")


@contextlib.contextmanager
def persistent_cache(directory):
  old = {k: getattr(jax.config, k) for k in _SETTINGS}
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", str(directory))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  try:
    yield
  finally:
    for k, v in old.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()
