"""algo.router_aux_coef: the router's load-balancing loss added to the DAPO loss, weighted
exactly across micro-batches, with gradients to the routers; refused on a dense model."""
import importlib

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax import config as config_lib
from dapo_jax.models.qwen2 import Qwen2
from dapo_jax.train.objective import loss_and_grad
from tests import test_train_step as ts
from tests.test_moe import _model

COEF = 0.5


def _run(model, coef, micro=None):
  graphdef, params = nnx.split(model)
  cfg = ts._cfg(micro_batch_size=micro, router_aux_coef=coef)
  loss, grads, metrics, _ = jax.jit(lambda p, mb: loss_and_grad(p, graphdef, mb, cfg))(
      params, ts._batch(B=8, seed=3))
  return float(loss), grads, {k: float(v) for k, v in metrics.items()}


@pytest.mark.parametrize("micro", [None, 2])
def test_loss_adds_coef_times_the_logged_router_loss(micro):
  model = _model()
  off, g_off, m_off = _run(model, 0.0, micro)
  on, g_on, m_on = _run(model, COEF, micro)
  assert m_on["router_aux_loss"] == pytest.approx(m_off["router_aux_loss"], rel=1e-6)
  assert 1.0 < m_off["router_aux_loss"] < 6.0  # E * sum f P: k = 2 when balanced, at most E
  # Micro-batches: each one's own loss weighted by its share of tokens; they sum to the
  # token-weighted mean that is logged.
  assert on - off == pytest.approx(COEF * m_off["router_aux_loss"], rel=1e-4, abs=1e-6)
  moved = [float(np.max(np.abs(a - b))) for a, b in zip(jax.tree.leaves(g_on),
                                                         jax.tree.leaves(g_off))]
  assert max(moved) > 1e-4  # the routers get the loss's gradient


def test_dense_model_refused_in_config_and_in_the_loss():
  c = importlib.import_module("configs.tiny_cpu").get_config("init=True")  # a dense model
  c.algo.router_aux_coef = 0.01
  with pytest.raises(ValueError, match=r"algo\.router_aux_coef.*mixture-of-experts"):
    config_lib.parse(c)
  with pytest.raises(ValueError, match=r"router_aux_coef=0\.5 needs a mixture-of-experts"):
    _run(Qwen2(ts.CFG, rngs=nnx.Rngs(0)), COEF)
