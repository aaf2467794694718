"""dapo_jax: DAPO (Clip-Higher, dynamic sampling, token-level loss, overlong shaping) in JAX.

Shape suffixes name each axis with one letter (nanodo style: `logp_BxT` is [B, T]); one meaning
per letter across the package:

  N   prompts (= groups) of a batch or generation round      Np  distinct prompts of a prefill
  G   responses per prompt (the group size)
  B   sequences (rows) handed to one device call: N·G training rows, or the sampler's slots
  T   token positions of a row (prompt + response; the training sequence length)
  S   KV-cache positions of a slot
  R   response positions (the generation budget, L_max)
  C   positions of one chunk (chunked log-probs, decode chunks)
  V   vocabulary                                              D   model width
  H   query heads                Kv  KV heads                 K   channels per head
  L   layers                     E   end-of-sequence token ids
  P   eval problems              k   samples per eval problem (avg@k, pass@k, maj@k; lower case)

Packages: core/ (pure maths), rewards/, models/, rollout/ (JetStream engine + group sampler),
data/, train/ (the loop), plus config, eval, metrics, sharding, aot (TPU compile checks).
"""
