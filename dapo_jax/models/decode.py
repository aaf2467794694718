"""The decode step's two layer loops (`Qwen2.decode_step` picks one by the cache's form).

- `scanned`: stacked cache [L, B, S, Kv, Hd] carried through lax.scan over layers and updated
  in place; one cache buffer, so it is the form for accelerators and big models.
- `unrolled`: per-layer cache buffers and per-layer weights; XLA:CPU would otherwise copy
  every stacked weight slice and a layer of cache at every step of a decode loop.
Both read only the live prefix of the cache (`DecodeAt.bucket` of `layers.decode_buckets`),
take replayed expert ids [Lm, B, 1, K] (or None) and return the MoE layers' expert ids likewise
(None for a dense model).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.models import layers as L
from dapo_jax.models.config import ModelConfig


class DecodeAt(NamedTuple):
  """Where one decode step writes and reads: its rows, positions and cache bucket."""
  rows: jax.Array
  positions_B: jax.Array
  bucket: jax.Array          # index into sizes: the live-prefix length attention reads
  sizes: tuple[int, ...]
  allowed_BxS: jax.Array


def unrolled(cfg: ModelConfig, layer_params: list[dict], h, cos, sin, cache, at: DecodeAt,
             replay=None):
  """Per-layer cache {"k", "v"}: tuples of L [B, S, Kv, Hd]; returns (h, cache likewise,
  expert ids)."""
  ks, vs = list(cache["k"]), list(cache["v"])
  branches = [functools.partial(L.attend_one_prefix, n=n) for n in at.sizes]
  ids = []
  for i, p in enumerate(layer_params):
    def attention(q, k, v, i=i):
      ks[i] = ks[i].at[at.rows, at.positions_B].set(k[:, 0].astype(ks[i].dtype))
      vs[i] = vs[i].at[at.rows, at.positions_B].set(v[:, 0].astype(vs[i].dtype))
      return jax.lax.switch(at.bucket, branches, q, ks[i], vs[i], at.allowed_BxS), None
    r = replay[len(ids)] if replay is not None and "router" in p else None
    h, _, routing = L.decoder_layer_routed(cfg, p, h, cos, sin, attention, replay_BxTxK=r)
    if routing is not None:
      ids.append(routing.ids)
  return h, {"k": tuple(ks), "v": tuple(vs)}, (jnp.stack(ids) if ids else None)


def _read_prefix(q, ck, cv, layer, allowed_BxS, *, n: int):
  """Attention of one layer over cache positions [0, n), sliced straight from the stack."""
  _, b, _, kv, hd = ck.shape
  k, v = (jax.lax.dynamic_slice(c, (layer, 0, 0, 0, 0), (1, b, n, kv, hd))[0] for c in (ck, cv))
  return L.attend_one(q, k, v, allowed_BxS[:, :n])


def scanned(cfg: ModelConfig, stacked_params: dict, h, cos, sin, cache, at: DecodeAt,
            replay=None):
  """Stacked cache {"k", "v"} [L, B, S, Kv, Hd], one kind of layer; returns (h, cache
  likewise, expert ids)."""
  branches = [functools.partial(_read_prefix, n=n) for n in at.sizes]

  def layer_step(carry, xs):
    p, r = xs
    h, layer, ck, cv = carry
    new = {}

    def attention(q, k, v):
      new["k"] = ck.at[layer, at.rows, at.positions_B].set(k[:, 0].astype(ck.dtype))
      new["v"] = cv.at[layer, at.rows, at.positions_B].set(v[:, 0].astype(cv.dtype))
      o = jax.lax.switch(at.bucket, branches, q, new["k"], new["v"], layer, at.allowed_BxS)
      return o, None
    h, _, routing = L.decoder_layer_routed(cfg, p, h, cos, sin, attention, replay_BxTxK=r)
    return (h, layer + 1, new["k"], new["v"]), (None if routing is None else routing.ids)

  init = (h, jnp.int32(0), cache["k"], cache["v"])
  (h, _, ck, cv), ids = jax.lax.scan(layer_step, init, (stacked_params, replay))
  return h, {"k": ck, "v": cv}, ids
