"""Host-side glue for multi-process runs (one process per host; also 2 local CPU processes).

Each host samples its slice of every generation round on its own devices (its slice of the
global sampler mesh, weights moved there device-to-device); the scored groups are gathered so
every host holds the same global batch, which the jitted update consumes as global arrays on
the training mesh. With one process every function here is the identity.
"""
import jax
import numpy as np
from jax.experimental import multihost_utils

from dapo_jax.train.groups import Groups

_MAX_ANSWER_BYTES = 256


def is_multi() -> bool:
  return jax.process_count() > 1


def put(arr: np.ndarray, sharding) -> jax.Array:
  """A global array from a host array that every process holds in full."""
  arr = np.asarray(arr)
  return jax.make_array_from_callback(arr.shape, sharding, lambda idx: arr[idx])


def put_tree(tree, sharding):
  return jax.tree.map(lambda x: put(x, sharding), tree)


def to_host(tree):
  """Full numpy values on every host (gathers arrays that span processes)."""
  if not is_multi():
    return jax.device_get(tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def per_process(values) -> np.ndarray:
  """float64 [processes, k]: every host's `values` (k numbers), in process order."""
  local = np.asarray(values, np.float64)[None]
  if not is_multi():
    return local
  return np.asarray(multihost_utils.process_allgather(local, tiled=True))


def _encode_answers(answers) -> np.ndarray:
  out = np.zeros((len(answers), _MAX_ANSWER_BYTES), np.uint8)
  for i, a in enumerate(answers):
    b = a.encode("utf-8")
    if len(b) >= _MAX_ANSWER_BYTES:
      raise ValueError(f"answer {i} is {len(b)} bytes; multi-host gathering allows "
                       f"{_MAX_ANSWER_BYTES - 1}")
    out[i, :len(b)] = np.frombuffer(b, np.uint8)
  return out


def gather_groups(g: Groups, *, max_prompt_len: int) -> Groups:
  """Concatenates every host's groups in process order (= the one-host batch order)."""
  if not is_multi():
    return g
  n = len(g)
  prompts = np.zeros((n, max_prompt_len), np.int32)
  plen = np.zeros((n,), np.int32)
  for i, p in enumerate(g.prompts):
    prompts[i, :len(p)], plen[i] = p, len(p)
  local = {"prompts": prompts, "plen": plen, "answers": _encode_answers(g.answers),
           "tokens": g.tokens, "behav_logp": g.behav_logp, "versions": g.versions,
           "lengths": g.lengths,
           "truncated": g.truncated, "correct": g.correct, "parsed": g.parsed, "score": g.score,
           "reward": g.reward}
  if g.expert_ids is not None:  # routing replay
    local.update(expert_ids=g.expert_ids, prompt_expert_ids=g.prompt_expert_ids)
  full = {k: np.asarray(v).reshape(-1, *np.asarray(v).shape[2:])
          for k, v in multihost_utils.process_allgather(local, tiled=False).items()}
  return Groups(
      prompts=[full["prompts"][i, :full["plen"][i]].tolist() for i in range(len(full["plen"]))],
      answers=[bytes(a).rstrip(b"\0").decode("utf-8") for a in full["answers"]],
      tokens=full["tokens"], behav_logp=full["behav_logp"], versions=full["versions"],
      lengths=full["lengths"],
      truncated=full["truncated"], correct=full["correct"], parsed=full["parsed"],
      score=full["score"], reward=full["reward"], expert_ids=full.get("expert_ids"),
      prompt_expert_ids=full.get("prompt_expert_ids"))
