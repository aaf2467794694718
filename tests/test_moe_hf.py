"""Qwen3-MoE against transformers' own Qwen3MoeForCausalLM (torch, CPU): logits, greedy
decoding, the load-balancing loss, both expert tensor layouts, both config spellings, export."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dapo_jax.models import hf_io  # noqa: E402
from tests import greedy_parity  # noqa: E402

VOCAB = 61
# mixed: dense layer 1 between MoE layers, normalised top-k; uniform: every layer MoE, raw
# top-k probabilities, tied embeddings (HF's defaults for the fields not given).
VARIANTS = {
    "mixed": dict(num_hidden_layers=3, mlp_only_layers=[1], norm_topk_prob=True),
    "uniform": dict(num_hidden_layers=2, norm_topk_prob=False, tie_word_embeddings=True),
}


def _write_tokenizer(path):
  from tokenizers import Tokenizer, models, pre_tokenizers
  tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB - 3)}, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0").save_pretrained(path)


def _build(variant, path):
  torch.manual_seed(1)
  cfg = transformers.Qwen3MoeConfig(
      vocab_size=VOCAB, hidden_size=32, intermediate_size=48, moe_intermediate_size=24,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=6,
      num_experts_per_tok=2, max_position_embeddings=128, initializer_range=0.2,
      **VARIANTS[variant])
  model = transformers.Qwen3MoeForCausalLM(cfg).eval()
  with torch.no_grad():  # random norms, so their loading is really checked
    for p in model.parameters():
      if p.ndim == 1:
        p.add_(0.3 * torch.randn_like(p))
  model.save_pretrained(path, max_shard_size="40KB")
  _write_tokenizer(path)
  return model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  return {v: (p, _build(v, p)) for v in VARIANTS for p in [tmp_path_factory.mktemp(v)]}


def _hf(model, toks, mask):
  with torch.no_grad():
    return model(input_ids=torch.tensor(toks), attention_mask=torch.tensor(mask),
                 output_router_logits=True)


_forward = nnx.jit(lambda m, t, k: m.logits(m.hidden_routed(t, k)[0]))
_routing = nnx.jit(lambda m, t, k: m.hidden_routed(t, k)[1])


def _logit_diff(model, hf_model):
  toks, mask = greedy_parity.padded_batch(VOCAB)
  ours = np.asarray(_forward(model, jnp.asarray(toks), jnp.asarray(mask)))
  return np.abs(ours - _hf(hf_model, toks, mask).logits.numpy())[mask.astype(bool)].max()


def test_checkpoint_layout_is_what_transformers_writes(checkpoints):
  path, _ = checkpoints["mixed"]
  names = set(hf_io.tensor_files(path))
  assert "model.layers.0.mlp.experts.5.gate_proj.weight" in names  # one tensor per expert
  assert "model.layers.0.mlp.gate.weight" in names and "model.layers.1.mlp.up_proj.weight" in names
  assert json.loads((path / "config.json").read_text())["num_local_experts"] == 6


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("impl", ["grouped", "dense"])
def test_logits_and_load_balancing_loss_match_transformers(checkpoints, variant, impl):
  path, hf_model = checkpoints[variant]
  model, cfg = hf_io.load_pretrained(path, moe_impl=impl)
  assert cfg.architecture == "qwen3_moe" and cfg.num_experts == 6
  assert cfg.moe_layers == ((0, 2) if variant == "mixed" else (0, 1))
  assert _logit_diff(model, hf_model) <= 1e-4
  toks, mask = greedy_parity.padded_batch(VOCAB)
  routing = _routing(model, jnp.asarray(toks), jnp.asarray(mask))
  want = float(_hf(hf_model, toks, mask).aux_loss)
  assert abs(float(routing.load_balancing_loss()) - want) <= 1e-5 * max(1.0, want)
  assert float(routing.num_tokens) == mask.sum()
  # expert load: k (token, slot) pairs per valid token in every MoE layer
  np.testing.assert_allclose(np.asarray(routing.tokens_per_expert_LxE).sum(-1),
                             2 * mask.sum())


_prefill = nnx.jit(lambda m, t, n: m.prefill(t, n, cache_len=40))
_decode = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))


def test_greedy_decode_matches_transformers(checkpoints):
  path, hf_model = checkpoints["mixed"]
  model, _ = hf_io.load_pretrained(path)
  toks, mask = greedy_parity.padded_batch(VOCAB)
  lengths = mask.sum(1)
  ours = greedy_parity.greedy_tokens(_prefill, _decode, model, toks * mask, lengths, 20)
  greedy_parity.assert_equals_hf_generate(hf_model, toks, lengths, ours)


def test_fused_expert_layout_and_old_config_spelling_load(checkpoints, tmp_path):
  """transformers 5.x's in-memory names (fused gate_up_proj / down_proj per layer) and a
  4.x-style config.json (num_experts, top-level rope_theta) load to the same model."""
  path, hf_model = checkpoints["mixed"]
  from safetensors.torch import save_file
  save_file({k: v.contiguous() for k, v in hf_model.state_dict().items()},
            str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  assert any(k.endswith("mlp.experts.gate_up_proj") for k in hf_model.state_dict())
  d = json.loads((path / "config.json").read_text())
  d["num_experts"] = d.pop("num_local_experts")
  d["rope_theta"] = d.pop("rope_parameters")["rope_theta"]
  (tmp_path / "config.json").write_text(json.dumps(d))
  model, cfg = hf_io.load_pretrained(tmp_path)
  assert cfg.num_experts == 6
  assert _logit_diff(model, hf_model) <= 1e-4


def test_export_round_trip(checkpoints, tmp_path):
  path, hf_model = checkpoints["mixed"]
  model, cfg = hf_io.load_pretrained(path)
  hf_io.save_pretrained(model, cfg, tmp_path / "out", tokenizer_dir=path)
  back, cfg2 = hf_io.load_pretrained(tmp_path / "out")
  assert cfg2 == cfg
  for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(back))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  hf_back = transformers.Qwen3MoeForCausalLM.from_pretrained(tmp_path / "out").eval()
  assert _logit_diff(model, hf_back) <= 1e-4
  names = set(hf_io.tensor_files(tmp_path / "out"))
  assert names == set(hf_io.tensor_files(path))  # the layout transformers itself writes
