"""Test setup: 8 host CPU devices, set before anything imports jax."""
import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax  # noqa: E402  (must come after XLA_FLAGS)
import pytest  # noqa: E402

jax.config.update("jax_numpy_rank_promotion", "raise")


@pytest.fixture(scope="session")
def cpu_devices():
  devs = jax.devices()
  assert len(devs) == 8, f"conftest expected 8 CPU devices, got {len(devs)}"
  return devs
