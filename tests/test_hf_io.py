"""Tests of dapo_jax.models.hf_io: parity with transformers, export round trip, bad inputs."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dapo_jax import sharding as S  # noqa: E402
from dapo_jax.models import hf_io  # noqa: E402
from tests import greedy_parity  # noqa: E402

VOCAB = 97
_COMMON = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
               initializer_range=0.2)
# One tiny config per covered family, each exercising its delta from Qwen2.
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(rope_theta=10000.0)),
    "llama": ("LlamaConfig", "LlamaForCausalLM", dict(
        tie_word_embeddings=True, rope_parameters=dict(
            rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
            high_freq_factor=4.0, original_max_position_embeddings=16))),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=16, rope_theta=10000.0)),
}


def _write_tokenizer(path, n_tokens):
  from tokenizers import Tokenizer, models, pre_tokenizers
  tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(n_tokens)}, unk_token="w0"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0")
  fast.save_pretrained(path)


def _build(family, path, max_shard_size="20KB"):
  cfg_name, model_name, extra = FAMILIES[family]
  torch.manual_seed(0)
  hf_cfg = getattr(transformers, cfg_name)(**_COMMON, **extra)
  hf_model = getattr(transformers, model_name)(hf_cfg).eval()
  with torch.no_grad():  # random norms and biases, so their loading is really checked
    for p in hf_model.parameters():
      if p.ndim == 1:
        p.add_(0.3 * torch.randn_like(p))
  hf_model.save_pretrained(path, max_shard_size=max_shard_size)
  _write_tokenizer(path, VOCAB - 5)
  return hf_model


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
  out = {}
  for family in FAMILIES:
    path = tmp_path_factory.mktemp(family)
    out[family] = (path, _build(family, path))
  return out


def _hf_logits(hf_model, toks, mask):
  with torch.no_grad():
    return hf_model(input_ids=torch.tensor(toks),
                    attention_mask=torch.tensor(mask)).logits.numpy()


_forward = nnx.jit(lambda m, t, k: m(t, k))
_prefill = nnx.jit(lambda m, t, l: m.prefill(t, l, cache_len=48))
_decode = nnx.jit(lambda m, t, p, c: m.decode_step(t, p, c))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_decode_match_transformers(checkpoints, family):
  path, hf_model = checkpoints[family]
  assert (path / hf_io.INDEX_FILE).is_file()  # sharded checkpoint with an index
  model, cfg = hf_io.load_pretrained(path)
  assert cfg.architecture == family
  toks, mask = greedy_parity.padded_batch(VOCAB)
  ours = np.asarray(_forward(model, jnp.asarray(toks), jnp.asarray(mask)))
  diff = np.abs(ours - _hf_logits(hf_model, toks, mask))[mask.astype(bool)]
  assert diff.max() <= 1e-4, diff.max()

  # Greedy: our batched prefill + decode (rows at different positions) vs HF per prompt.
  lengths = np.array([12, 8, 5])
  ours_tokens = greedy_parity.greedy_tokens(_prefill, _decode, model, toks * mask, lengths, 32)
  greedy_parity.assert_equals_hf_generate(hf_model, toks, lengths, ours_tokens)


@pytest.mark.parametrize("family", ["qwen2", "llama"])
def test_export_round_trip(checkpoints, family, tmp_path):
  path, hf_model = checkpoints[family]
  mesh = S.make_mesh({"fsdp": 2, "tensor": 4})
  model, cfg = hf_io.load_pretrained(path, mesh=mesh)
  assert nnx.state(model)["layers"]["w_up"].get_value().sharding.spec == \
      S.model_shardings(model, mesh)["layers"]["w_up"].get_value().spec
  out = tmp_path / "export"
  hf_io.save_pretrained(model, cfg, out, tokenizer_dir=path, max_shard_bytes=40_000)
  assert (out / hf_io.INDEX_FILE).is_file() and (out / "tokenizer.json").is_file()
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
  assert type(reloaded).__name__ == FAMILIES[family][1]
  toks, mask = greedy_parity.padded_batch(VOCAB)
  np.testing.assert_array_equal(_hf_logits(reloaded, toks, mask),
                                _hf_logits(hf_model, toks, mask))
  tok = transformers.AutoTokenizer.from_pretrained(out)
  assert tok.convert_tokens_to_ids("w7") == 7
  # Our loader reads our export back to identical parameters.
  again, cfg2 = hf_io.load_pretrained(out)
  assert cfg2 == cfg
  for a, b in zip(jax.tree.leaves(nnx.state(again)), jax.tree.leaves(nnx.state(model))):
    np.testing.assert_array_equal(a, b)
  with pytest.raises(ValueError, match="already holds a checkpoint"):
    hf_io.save_pretrained(model, cfg, out)
  hf_io.save_pretrained(model, cfg, out, overwrite=True)  # one file, no stale shards
  assert sorted(p.name for p in out.glob("*.safetensors")) == ["model.safetensors"]
  assert not (out / hf_io.INDEX_FILE).exists()
  single, _ = hf_io.load_pretrained(out, mesh=mesh)  # the no-index path
  for a, b in zip(jax.tree.leaves(nnx.state(single)), jax.tree.leaves(nnx.state(model))):
    np.testing.assert_array_equal(a, b)
    assert a.sharding == b.sharding


def test_bfloat16_load_and_export(checkpoints, tmp_path):
  path, hf_model = checkpoints["qwen2"]
  model, cfg = hf_io.load_pretrained(path, dtype="bfloat16")
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(nnx.state(model)))
  toks, mask = greedy_parity.padded_batch(VOCAB)
  ours = np.asarray(_forward(model, jnp.asarray(toks), jnp.asarray(mask)))
  ref = _hf_logits(hf_model, toks, mask)
  assert np.abs(ours - ref)[mask.astype(bool)].max() < 0.25
  hf_io.save_pretrained(model, cfg, tmp_path)
  assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path)
  assert reloaded.model.embed_tokens.weight.dtype == torch.bfloat16


# ----- bad inputs ------------------------------------------------------------------------
def _copy(checkpoints, family, tmp_path):
  dst = tmp_path / "ckpt"
  shutil.copytree(checkpoints[family][0], dst)
  return dst


def _edit_config(path, **changes):
  d = json.loads((path / "config.json").read_text())
  d.update(changes)
  (path / "config.json").write_text(json.dumps(d))


def test_error_unsupported_architecture(checkpoints, tmp_path):
  path = _copy(checkpoints, "qwen2", tmp_path)
  _edit_config(path, model_type="gpt2")
  with pytest.raises(ValueError, match=r"config.json: unsupported architecture.*'gpt2'"):
    hf_io.load_pretrained(path)
  d = json.loads((path / "config.json").read_text())
  del d["hidden_size"]
  d["model_type"] = "qwen2"
  (path / "config.json").write_text(json.dumps(d))
  with pytest.raises(ValueError, match=r"config.json: missing required key 'hidden_size'"):
    hf_io.load_pretrained(path)


def test_error_shape_mismatch_names_tensor_and_file(checkpoints, tmp_path):
  path = _copy(checkpoints, "qwen2", tmp_path)
  _edit_config(path, intermediate_size=48)
  with pytest.raises(ValueError, match=r"shape mismatch for tensor "
                     r"'model.layers.0.mlp.gate_proj.weight' in .*model-000\d\d-of"):
    hf_io.load_pretrained(path)


def test_error_vocab_mismatch_with_tokenizer(checkpoints, tmp_path):
  path = _copy(checkpoints, "qwen2", tmp_path)
  _write_tokenizer(path, VOCAB + 10)
  with pytest.raises(ValueError, match=r"vocab mismatch.*107 tokens.*vocab_size=97"):
    hf_io.load_pretrained(path)


def test_error_missing_and_unexpected_tensors(checkpoints, tmp_path):
  from safetensors.numpy import load_file, save_file
  path = _copy(checkpoints, "qwen2", tmp_path)
  index = json.loads((path / hf_io.INDEX_FILE).read_text())
  name = "model.layers.1.self_attn.k_proj.bias"
  file = path / index["weight_map"][name]
  tensors = load_file(file)
  tensors.pop(name)
  save_file(tensors, file, metadata={"format": "pt"})
  with pytest.raises(ValueError, match=f"tensor '{name}' is not readable from .*{file.name}"):
    hf_io.load_pretrained(path)
  del index["weight_map"][name]
  (path / hf_io.INDEX_FILE).write_text(json.dumps(index))
  with pytest.raises(ValueError, match=f"missing tensor '{name}'"):
    hf_io.load_pretrained(path)
  # A Llama-style config (no biases) over a Qwen2 checkpoint: the biases are unused.
  path2 = _copy(checkpoints, "qwen2", tmp_path / "b")
  _edit_config(path2, model_type="llama", attention_bias=False)
  with pytest.raises(ValueError, match=r"tensor\(s\) this llama config does not use.*bias"):
    hf_io.load_pretrained(path2)


def test_error_corrupt_or_missing_files(checkpoints, tmp_path):
  path = _copy(checkpoints, "qwen2", tmp_path)
  shard = sorted(path.glob("model-*.safetensors"))[0]
  data = shard.read_bytes()
  shard.write_bytes(data[: len(data) // 2])  # truncated
  with pytest.raises(ValueError, match=f"corrupt or unreadable safetensors file .*{shard.name}"):
    hf_io.load_pretrained(path)
  shard.write_bytes(b"\x00garbage" * 10)
  with pytest.raises(ValueError, match=f"corrupt or unreadable safetensors file .*{shard.name}"):
    hf_io.load_pretrained(path)
  shard.unlink()
  with pytest.raises(ValueError, match=f"lists shard {shard.name}, which is missing"):
    hf_io.load_pretrained(path)
  (path / hf_io.INDEX_FILE).write_text("{not json")
  with pytest.raises(ValueError, match="not a valid safetensors index"):
    hf_io.load_pretrained(path)
  (path / "config.json").unlink()
  with pytest.raises(ValueError, match="no config.json"):
    hf_io.load_pretrained(path)
  with pytest.raises(ValueError, match="is not a directory"):
    hf_io.load_pretrained(tmp_path / "nope")
  empty = tmp_path / "empty"
  empty.mkdir()
  shutil.copy(checkpoints["qwen2"][0] / "config.json", empty)
  with pytest.raises(ValueError, match=r"no \*.safetensors files"):
    hf_io.load_pretrained(empty)


def test_hub_id_resolution(checkpoints, monkeypatch, tmp_path):
  import huggingface_hub
  calls = []

  def fake_download(repo_id, allow_patterns):
    calls.append(repo_id)
    if repo_id == "org/missing":
      raise OSError("no network")
    return str(checkpoints["qwen2"][0])

  monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
  assert hf_io.resolve_path("Qwen/Qwen2.5-0.5B") == checkpoints["qwen2"][0]
  with pytest.raises(ValueError, match="org/missing is not a local directory.*no network"):
    hf_io.load_pretrained("org/missing")
  with pytest.raises(ValueError, match="is not a directory"):
    hf_io.resolve_path(tmp_path / "a" / "b" / "c")  # a path, not an id: never fetched
  assert calls == ["Qwen/Qwen2.5-0.5B", "org/missing"]


def test_save_errors(checkpoints, tmp_path):
  path = checkpoints["qwen2"][0]
  model, cfg = hf_io.load_pretrained(path)
  import dataclasses
  with pytest.raises(ValueError, match="model_config.hidden_size=64"):
    hf_io.save_pretrained(model, dataclasses.replace(cfg, hidden_size=64), tmp_path / "a")
  with pytest.raises(ValueError, match="holds no tokenizer"):
    hf_io.save_pretrained(model, cfg, tmp_path / "b", tokenizer_dir=tmp_path)
  assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
