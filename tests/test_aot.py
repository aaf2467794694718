"""The AOT check: TPU compiles of small runs on this CPU machine (libtpu), topology table,
errors, the verdict, and that every config model field reaches the model."""
import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from configs import tiny_cpu
from dapo_jax import config as config_lib
from dapo_jax.aot import report, topology
from dapo_jax.models import hf_io
from dapo_jax.train import placement, setup

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_LIBTPU = importlib.util.find_spec("libtpu") is not None
needs_libtpu = pytest.mark.skipif(not HAS_LIBTPU, reason="libtpu is not installed (pip install "
                                  "-r requirements-dev.txt): TPU compiles need it")


def _cfg(**fields):
  c = tiny_cpu.get_config()
  for k, v in fields.items():
    section, name = k.split(".")
    c[section][name] = v
  return config_lib.parse(c)


# ---- model fields ---------------------------------------------------------------------------
def test_every_model_field_is_routed():
  names = {f.name for f in dataclasses.fields(config_lib.ModelCfg)}
  routed = (set(setup.SOURCE_FIELDS) | set(setup.ARCH_FIELDS) | set(setup.RUN_FIELDS)
            | set(setup.TRAINER_FIELDS))
  assert names == routed, f"ModelCfg fields not routed to the model: {names ^ routed}"


CHANGED = {"dtype": "bfloat16", "param_dtype": "bfloat16", "remat": True, "scan_layers": True,
           "logits_chunk": 64,
           "vocab_size": 300, "hidden_size": 64, "intermediate_size": 96, "num_layers": 2,
           "num_heads": 8, "num_kv_heads": 4, "head_dim": 16, "rope_theta": 5e5,
           "tie_word_embeddings": False, "attention_impl": "plain", "attention_chunk": 64,
           "num_experts": 4, "num_experts_per_tok": 1, "moe_intermediate_size": 64,
           "norm_topk_prob": False, "moe_impl": "dense"}


@pytest.mark.parametrize("field", setup.ARCH_FIELDS + setup.RUN_FIELDS)
def test_config_source_field_reaches_model(field):
  base = _cfg(**{"model.source": "config"})
  changed = _cfg(**{"model.source": "config", f"model.{field}": CHANGED[field]})
  got = setup.model_config(changed, 162)
  assert getattr(got, field) == CHANGED[field]
  assert getattr(setup.model_config(base, 162), field) != CHANGED[field]


@pytest.mark.parametrize("field", setup.RUN_FIELDS)
def test_hf_source_run_field_reaches_model(field):
  hf = hf_io.read_config(setup.resolve_path("dapo_jax/assets/tiny_base"))
  got = setup.model_config(_cfg(**{f"model.{field}": CHANGED[field]}), 0, hf)
  assert getattr(got, field) == CHANGED[field]
  # The config's own value wins too (tiny_cpu's scan_layers=False over the loader's True).
  assert getattr(setup.model_config(_cfg(), 0, hf), field) == getattr(_cfg().model, field)
  assert got.hidden_size == hf.hidden_size  # the architecture stays the checkpoint's


def test_build_model_hf_applies_run_fields(cpu_devices):
  cfg = _cfg(**{"model.dtype": "bfloat16", "model.remat": True, "model.logits_chunk": 64})
  mesh = placement.build_mesh(cfg, cpu_devices)
  model, mcfg = setup.build_model(cfg, mesh, [0] * 162)
  assert (model.cfg.dtype, model.cfg.remat, model.cfg.logits_chunk) == ("bfloat16", True, 64)
  assert mcfg == model.cfg
  with pytest.raises(ValueError, match="config.model.vocab_size: 999 != the checkpoint's 162"):
    setup.build_model(_cfg(**{"model.vocab_size": 999}), mesh, [0] * 162)


# ---- topology table and verdict -------------------------------------------------------------
def test_topology_table():
  s = topology.parse("v5p-128")
  assert (s.chips, s.grid, s.hosts, s.hbm_bytes) == (64, "4x4x4", 16, 95 * topology.GiB)
  assert (topology.parse("v5e-8").hosts, topology.parse("v5e-256").hosts) == (1, 64)
  assert topology.parse("v4-8").chips == 4 and topology.parse("v6e-64").hbm_bytes == 32 * 2**30
  with pytest.raises(ValueError, match="unknown TPU slice 'v7x-8'"):
    topology.parse("v7x-8")
  with pytest.raises(ValueError, match="'v5p-12' is not a v5p slice size"):
    topology.parse("v5p-12")
  # One host of a slice, as a topology of its own (the per-host sampler's chips).
  host = topology.one_host(topology.parse("v6e-256"))
  assert (host.name, host.chips, host.grid, host.hosts) == ("v6e-4", 4, "2x2", 1)
  assert topology.one_host(topology.parse("v5p-128")).name == "v5p-8"
  assert topology.one_host(topology.parse("v5e-8")).name == "v5e-8"  # one host already


def _row(name, temp, resident=()):
  return dict(name=name, status="compiled", temp_bytes=temp, argument_bytes=1, output_bytes=0,
              alias_bytes=0, code_bytes=0, peak_bytes=temp + 1, resident=list(resident))


def test_verdict_adds_resident_buffers_and_names_largest_items():
  rows = [_row("a", 10), _row("b", 4, ("train_state",))]
  s = report.summarize(rows, {"train_state": 8}, hbm_bytes=12)
  assert (s["peak_bytes"], s["peak_function"], s["fits"]) == (13, "b", False)
  assert [i["name"] for i in s["largest_items"]] == ["resident train_state", "b temporaries",
                                                     "b arguments"]
  assert report.summarize(rows, {"train_state": 8}, hbm_bytes=13)["fits"]


# ---- compiles for TPU slices ----------------------------------------------------------------
def _aot(tmp_path, *args):
  out = tmp_path / "aot.json"
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  p = subprocess.run([sys.executable, "-m", "dapo_jax.aot", *args, f"--json={out}"], cwd=REPO,
                     env=env, capture_output=True, text=True, timeout=600)
  return p, (json.loads(out.read_text()) if out.exists() else None)


SMALL = ["--config.model.source=config", "--config.model.hidden_size=512",
         "--config.model.intermediate_size=1536", "--config.model.num_layers=2",
         "--config.model.num_heads=8", "--config.model.num_kv_heads=4",
         "--config.model.head_dim=64", "--config.model.dtype=bfloat16",
         "--config.model.remat=True", "--config.rollout.kv_cache_gib=0.01"]


@needs_libtpu
@pytest.mark.parametrize("topo,extra", [("v5p-8", []), ("v5e-8", SMALL)])
def test_compiles_for_tpu(tmp_path, topo, extra):
  p, out = _aot(tmp_path, "--config=configs/tiny_cpu.py", f"--topology={topo}", *extra)
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  names = [f["name"] for f in out["functions"]]
  assert names == ["init_train_state", "train_step", "old_logprobs", "sampler_prefill",
                   "sampler_insert", "sampler_generate_chunk", "weight_transfer"]
  assert all(f["status"] == "compiled" and f["peak_bytes"] > 0 for f in out["functions"])
  assert out["fits"] and 0 < out["peak_bytes"] <= out["hbm_bytes"]
  assert "step peak per chip" in p.stdout


@needs_libtpu
def test_int8_sampler_weights_compile_and_shrink(tmp_path):
  """rollout.weight_dtype=int8: the sampler's functions compile with int8 projections, and the
  JSON records the weight dtype and bytes per chip (the projections at a byte, plus scales)."""
  fns = "--functions=sampler_prefill,sampler_generate_chunk,weight_transfer"
  got = {w: _aot(tmp_path, "--config=configs/tiny_cpu.py", "--topology=v5e-8", fns, *SMALL,
                 f"--config.rollout.weight_dtype={w}") for w in ("auto", "int8")}
  for p, _ in got.values():
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  bf16, int8 = got["auto"][1], got["int8"][1]
  assert (bf16["sampler_weight_dtype"], int8["sampler_weight_dtype"]) == ("bfloat16", "int8")
  assert bf16["sampler_weight_bytes_per_chip"] == bf16["resident_buffers"]["sampler_params"]
  ratio = int8["sampler_weight_bytes_per_chip"] / bf16["sampler_weight_bytes_per_chip"]
  assert 0.5 < ratio < 0.9  # the embedding (vocab 162 x 512) stays bf16 in a 2-layer model


KERNEL_MODEL = [a.replace("head_dim=64", "head_dim=128") for a in SMALL[:-1]]


@needs_libtpu
@pytest.mark.parametrize("paged", [True, False])
def test_kernels_field_names_paged_attention(tmp_path, paged):
  """The JSON's `kernels` lists the Pallas kernels of each compiled function, and their union."""
  p, out = _aot(tmp_path, "--config=configs/tiny_cpu.py", "--topology=v5p-8",
                "--functions=sampler_insert,sampler_generate_chunk", *KERNEL_MODEL,
                f"--config.rollout.paged_kv={paged}")
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  got = {f["name"]: f["kernels"] for f in out["functions"]}
  want = ["paged_attention"] if paged else []
  assert got == {"sampler_insert": [], "sampler_generate_chunk": want}
  assert out["kernels"] == want and out["paged_kv"] is paged
  assert ("Pallas kernels: sampler_generate_chunk: paged_attention" in p.stdout) is paged


def test_pallas_kernels_parses_tpu_custom_calls():
  hlo = ('  %paged_attention.1 = (f32[8]) custom-call(%a), custom_call_target="tpu_custom_call", '
         'metadata={op_name="jit(f)/pallas_call"}\n'
         '  %fusion = f32[8] fusion(%b), kind=kLoop\n'
         '  %splash_mha_fwd.3 = f32[8] custom-call(%c), custom_call_target="tpu_custom_call"\n'
         '  %my_kernel.2 = f32[8] custom-call(%c), custom_call_target="tpu_custom_call"\n')
  assert report.pallas_kernels(hlo) == ["my_kernel", "paged_attention", "splash_attention"]
  assert report.pallas_kernels("%x = f32[] custom-call(), custom_call_target=\"Sharding\"") == []


def test_negative_cost_model_seconds_are_not_a_time():
  class Compiled:
    def __init__(self, secs):
      self.secs = secs

    def cost_analysis(self):
      return [{"flops": 2e9, "bytes accessed": 1e9, "optimal_seconds": self.secs}]

  assert report._cost(Compiled(0.05))["cost_seconds"] == 0.05
  assert report._cost(Compiled(-1.98)) == {"flops": 2e9, "bytes_accessed": 1e9,
                                            "cost_seconds": None}


@needs_libtpu
@pytest.mark.parametrize("args,msg", [
    (["--topology=v9-8"], "unknown TPU slice"),
    (["--topology=v5p-8", "--config.mesh.tensor=3"], "config.mesh"),
    (["--topology=v5p-8", "--config.train.micro_batch_size=2"],
     "config.train.micro_batch_size: 2 sequences"),
    # tiny_cpu loads dapo_jax/assets/tiny_base: its architecture is the checkpoint's.
    (["--topology=v5p-8", "--config.model.num_layers=4"],
     "config.model.num_layers: set on the command line, but model.source='hf'"),
])
def test_clear_errors(tmp_path, args, msg):
  p, _ = _aot(tmp_path, "--config=configs/tiny_cpu.py", *args)
  assert p.returncode == 2 and msg in p.stderr, p.stderr[-2000:]


# ---- launch.py: one check per distinct compile, refusal ------------------------------------
def test_launch_checks_each_distinct_compile_and_refuses(tmp_path, monkeypatch):
  sys.path.insert(0, os.path.join(REPO, "experiments"))
  import launch  # pylint: disable=import-outside-toplevel
  spec = lambda name, ov: launch.RunSpec(name, "configs/x.py", ov, str(tmp_path / name))
  eps = [spec(f"e{i}", {"algo.eps_high": str(e), "seed": "1"}) for i, e in enumerate((0.2, 0.3))]
  lens = [spec(f"l{n}", {"rollout.max_new_tokens": str(n)}) for n in (32, 64)]
  assert launch.aot_key(eps[0]) == launch.aot_key(eps[1])
  assert launch.aot_key(lens[0]) != launch.aot_key(lens[1])
  calls = []

  def fake_run(cmd, **_):
    calls.append(cmd)
    rc = 1 if "--config.rollout.max_new_tokens=64" in cmd else 0
    return subprocess.CompletedProcess(cmd, rc, stdout="step peak per chip: ...", stderr="")

  monkeypatch.setattr(launch.subprocess, "run", fake_run)
  assert launch.aot_check(eps + lens, "v5p-8") == {"l64": None}
  assert len(calls) == 3 and all("--topology=v5p-8" in c for c in calls)
  calls.clear()  # --fit_search: l64 compiled for v5p-16, then v5p-32, where it fits

  def fits_at_32(cmd, **_):
    calls.append(cmd)
    rc = 0 if "--config.rollout.max_new_tokens=64" not in cmd or "--topology=v5p-32" in cmd else 1
    return subprocess.CompletedProcess(cmd, rc, stdout="step peak per chip: ...", stderr="")

  monkeypatch.setattr(launch.subprocess, "run", fits_at_32)
  args = argparse.Namespace(backend="tpu-pod", skip_fit_check=False, topology="v5p-8",
                            fit_search=True)
  with pytest.raises(launch.LaunchError, match="do\\(es\\) not fit the slice .* by compilation: "
                     "l64 fits v5p-32; --skip_fit_check"):
    launch.launch_pod.fit_check(args, lens)
  assert [c[c.index("-m") + 3] for c in calls] == ["--topology=v5p-8"] * 2 + [
      "--topology=v5p-16", "--topology=v5p-32"]
  with pytest.raises(launch.LaunchError, match="--fit_search compiles them"):
    launch.launch_pod.fit_check(argparse.Namespace(**dict(vars(args), fit_search=False)), lens)
  with pytest.raises(SystemExit):  # a real tpu-pod launch needs the slice for the check
    launch.main(["--config=configs/dapo_qwen25_32b.py", "--backend=tpu-pod", "--tpu_name=p",
                 "--zone=z", f"--workdir={tmp_path}"])


@needs_libtpu
def test_context_parallel_compiles_with_splash_per_shard(tmp_path):
  """mesh.context = 2 on a 4-host v6e slice: the trainer's mesh records the context axis, the
  splash kernel runs per shard in train_step and old_logprobs, and the colocated synchronous
  loop's update holds no sampler weights (the loop frees them until the sync)."""
  p, out = _aot(tmp_path, "--config=configs/tiny_cpu.py", "--topology=v6e-16",
                "--functions=train_step,old_logprobs", "--config.mesh.context=2",
                "--config.mesh.tensor=2")
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  assert out["trainer_mesh"] == {"data": 4, "fsdp": 1, "context": 2, "tensor": 2}
  rows = {f["name"]: f for f in out["functions"]}
  assert rows["train_step"]["kernels"] == rows["old_logprobs"]["kernels"] == ["splash_attention"]
  assert "sampler_params" not in rows["train_step"]["resident"] + rows["old_logprobs"]["resident"]


@needs_libtpu
def test_v6e_per_host_sampler_compiles_on_the_hosts_own_grid(tmp_path):
  """A v6e host's 2x2 chips are device ids 0, 1, 4, 5 of the slice, which XLA's TPU compiler
  refuses in a compile-only all-reduce; the per-host sampler compiles on a one-host topology
  (the same 2x2 chips) instead, with tensor 4 over all of them."""
  p, out = _aot(tmp_path, "--config=configs/tiny_cpu.py", "--topology=v6e-16",
                "--functions=sampler_prefill", "--config.mesh.tensor=4")
  assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  assert out["sampler_mesh_per_host"] == {"data": 1, "fsdp": 1, "tensor": 4}
  assert out["functions"][0]["status"] == "compiled"


@needs_libtpu
def test_lora_plan_trains_and_syncs_the_adapters_only(tmp_path):
  """config.lora.rank > 0: train_step compiles with the frozen base as an argument, the train
  state and the weight sync hold the adapters alone, and both the trainer's and the sampler's
  copy of the base are counted as resident buffers."""
  fns = "--functions=train_step,weight_transfer"
  got = {r: _aot(tmp_path, "--config=configs/tiny_cpu.py", "--topology=v5e-8", fns, *SMALL,
                 f"--config.lora.rank={r}") for r in (0, 2)}
  for p, _ in got.values():
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
  full, lo = (got[r][1]["resident_buffers"] for r in (0, 2))
  assert full["frozen_params"] == full["sampler_base"] == 0
  assert lo["train_state"] < 0.25 * full["train_state"] and lo["frozen_params"] > 0
  assert lo["sampler_params"] < 0.25 * full["sampler_params"] < lo["sampler_base"]
  step = {f["name"]: f for f in got[2][1]["functions"]}["train_step"]
  assert step["status"] == "compiled" and "sampler_base" in step["resident"]
