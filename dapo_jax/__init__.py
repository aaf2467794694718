"""dapo_jax: DAPO (Clip-Higher, dynamic sampling, token-level loss, overlong shaping) in JAX.

Shape suffixes name each axis with one letter (nanodo style: `logp_BxT` is [B, T]); one meaning
per letter across the package:

  N   prompts (= groups) of a batch or generation round      Np  distinct prompts of a prefill
  G   responses per prompt (the group size)
  B   sequences (rows) handed to one device call: N·G training rows, or the sampler's slots
  T   token positions of one model call
  S   positions of a row (prompt + response: Config.seq_len, the MiniBatch fields), or a decode
      cache's length
  R   response positions (the generation budget, L_max)
  C   positions of one chunk (chunked log-probs, decode chunks)
  V   vocabulary                                              D   model width
  H   query heads                Kv  KV heads                 L   layers
  K   channels per head (attention: q_BxTxHxK); experts per token (routing: expert_ids_BxSxLxK);
      samples inserted per call (the sampler's slot_K)
  E   experts of an MoE layer (gate_ExDxF); eos_E: the stop token ids
  F   an expert's SwiGLU channels, or trailing feature axes (packing.to_rows)
  P   prompt positions; a page table's pages (table_BxP); eval problems (correct_Pxk)
  W   page writes
  k   samples per eval problem (avg@k, pass@k, maj@k; lower case)
Docstrings also write Hd (heads x channels), Lm (MoE layers) and Tp (packed positions).

Packages: core/ (pure maths), rewards/, models/, rollout/ (JetStream engine + group sampler),
data/, train/ (the loop), config/ (typed config and its checks), workdir/ (paths, lock, run
record), analysis/ (the notebook's statistics), aot/ (TPU compile checks), plus eval, metrics, sharding.
"""
