"""The paper's Table 1 as six configurations of one loop, and its sweeps.

Rungs (cumulative, as Table 1; AIME-24 avg@32 for Qwen2.5-32B in the paper):
  naive_grpo      GRPO: symmetric clip 0.2, sample-level loss (seq-mean-token-mean), no
                  overlong handling, no dynamic sampling                                  30
  overlong_filter + truncated responses masked out of the loss                            36
  clip_higher     + eps_high 0.28                                                         38
  soft_overlong   + Eq. 13 soft punishment (replacing filtering, as the reference script) 41
  token_level     + token-level loss (token-mean)                                         42
  dapo            + dynamic sampling                                                      50
Dual-clip (c = 10) and no KL are held fixed on every rung.

The default base is the ablation testbed (configs/testbed_cpu.py): mixed difficulty,
truncated and re-checking responses and a high-entropy base, so each rung's technique has
something to act on.

COMMAND (one rung):
  python -m dapo_jax.main --config=configs/ladder.py:rung=dapo --workdir=runs/ladder/dapo
COMMAND (the whole ladder x 5 seeds on this machine, then the eps_high and L_cache sweeps x 3):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=2 \
      --workdir=runs/ladder --sweep=ladder
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=2 \
      --workdir=runs/sweeps --sweep=eps_high,l_cache
COMMAND (ablations beyond the paper: the difficulty pre-filter and the adaptive overlong ramp, on):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=2 \
      --workdir=runs/beyond --sweep=beyond
COMMAND (the difficulty pre-filter where prompts recur: a 120-prompt pool; off, on, on with margin 0.1):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=2 \
      --workdir=runs/prefilter_pool --sweep=prefilter_pool
COMMAND (the policy-loss family: the DAPO rung with each algo.loss_mode; the
  committed runs used the tiny base):
  python experiments/launch.py --config=configs/ladder.py:base=tiny --backend=local \
      --parallel=2 --workdir=runs/variants --sweep=loss_mode
COMMAND (the pilots for the paper's update schedule: the DAPO rung on base testbed16 with each
  PILOT_ARMS learning rate / clip range x PILOT_SEEDS; read clipfrac_upper and the group shares):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=1 \
      --workdir=runs/pilot16 --sweep=pilot16
COMMAND (the campaign on base testbed16: the six rungs and the compute-matched arm x SEEDS16,
  in LADDER16_PHASES' order (the claims closest to decidable first), each phase seed-major so a
  campaign cut short stays paired; re-running it skips finished runs and resumes a cut one):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=1 \
      --workdir=runs/ladder16 --sweep=ladder16
COMMAND (the pre-registered confirmatory campaign: the arms and fresh seeds that
  experiments/preregistration/testbed_confirm.json names, seed-major, with its overrides;
  re-running skips finished runs and resumes a cut one; experiments/confirm.py reads it):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=2 \
      --workdir=runs/testbed_confirm --sweep=testbed_confirm
COMMAND (rollout and training at the same time: the DAPO rung at max_staleness 0, 1, 2, 4,
  the sampler on half of 8 CPU devices, partial rollouts and token-level truncated IS on every
  arm, 3 seeds):
  XLA_FLAGS=--xla_force_host_platform_device_count=8 python experiments/launch.py \
      --config=configs/ladder.py --backend=local --parallel=1 --workdir=runs/async \
      --sweep=staleness
COMMAND (int8 sampler weights with token-level IS at 2 against bf16 sampler weights, the DAPO
  rung, 3 seeds; exploratory):
  python experiments/launch.py --config=configs/ladder.py --backend=local --parallel=1 \
      --workdir=runs/int8_rollout --sweep=int8_rollout
EXPECTED: see experiments/results/README.md for the measured runtimes and outcomes on this
  machine; the rungs' ordering at this scale is reported with CIs in
  notebooks/ablations.ipynb, including the claims that do not reproduce.

Options (`:key=value,...`): rung (above, or token_level_matched), base (testbed | testbed16 |
tiny | qwen25_32b), seed. testbed16 is the testbed on the paper's update schedule: 16 optimizer
updates per rollout step (1 prompt x G = 16 responses each), the learning rate LR16, and the
later warm-start snapshot BASE16, whose easiest level has all-correct groups before any RL.
token_level_matched is the token_level rung sampling as many prompts a step as the dapo rung
does in a round (algo.gen_batch_size) and training on all of them, at the same prompts per
update: the compute-matched control of dynamic sampling (the same generated tokens, no filter).
"""
import importlib
import os

from configs.base import parse_arg

RUNGS = ("naive_grpo", "overlong_filter", "clip_higher", "soft_overlong", "token_level", "dapo")
EPS_HIGH = (0.20, 0.28, 0.36, 0.44)
L_CACHE_FRACTIONS = (0.0, 0.25, 0.5)   # of L_max; 0 = hard cut at L_max
SEEDS = (0, 1, 2, 3, 4)     # the ladder's
SWEEP_SEEDS = (0, 1, 2)     # the eps_high, l_cache and loss_mode sweeps'
PREFILTER_POOL = 120        # prompts: 30 steps of 24-prompt rounds visit each ~6 times
SEEDS16 = tuple(range(12))   # the campaign's: the power analysis's ask for the claims closest
                             # to decidable (paired t, 80 % power at alpha / 9; the notebook)
LADDER16_PHASES = (          # arms in the order the campaign runs them, each phase seed-major:
    ("token_level", "dapo", "token_level_matched", "soft_overlong"),  # dynamic sampling and
    ("clip_higher", "overlong_filter", "naive_grpo"))                 # token-level claims first
PILOT_SEEDS = (0, 1)
BASE16 = "dapo_jax/assets/testbed_base_1600"  # relative to the repo root
LR16 = 1e-4                 # per update; the pilot16 sweep's choice (experiments/results/pilot16):
                            # the upper clip binds on ~0.1 % of tokens and accuracy still rises
PILOT_ARMS = {              # the pilot16 sweep: learning rate, and a narrower clip range
    "lr1e-04": {"optim.lr": 1e-4},
    "lr5e-05": {"optim.lr": 5e-5},
    "lr5e-05_eps0.10": {"optim.lr": 5e-5, "algo.eps_low": 0.1, "algo.eps_high": 0.14}}
EPS_PILOT = {               # the eps_pilot sweep: settings where the upper clip may act more
    "lr8e-04": {"optim.lr": 8e-4},                              # 4x the per-update step
    "mb16": {"train.num_minibatches": 16},                      # 16 updates per rollout step
    "mb16_lr4e-04": {"train.num_minibatches": 16, "optim.lr": 4e-4}}
EPS_PILOT_ARMS = (0.20, 0.28)   # eps_high; eps_low stays 0.2 (0.20 = no Clip-Higher)
EPS_PILOT_SEEDS = (0, 1, 2)
LORA_RANKS = (1, 8, 32)     # the lora_ranks sweep's adapter ranks (its full-weight arm: dapo_s*)
LORA_LR_FACTOR = 10         # x the rung's learning rate for adapters (LoRA's usual ratio)
LORA_LR_ARMS = ((8, 3), (32, 3), (32, 30))  # the lora_lr sweep's (rank, x the rung's lr)
REGISTRATIONS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "experiments", "preregistration")  # <campaign>.json: sweeps too
STALENESS = (0, 1, 2, 4)   # rollout.max_staleness arms of the staleness sweep (policy versions)
PREFILTER_ARMS = {          # the prefilter_pool sweep's arms: off, the default rule, a looser one
    "off": {"algo.prefilter": False},
    "prefilter": {"algo.prefilter": True},
    "prefilter_m10": {"algo.prefilter": True, "algo.prefilter_margin": 0.1}}


def _base(name: str, seed: int):
  if name == "testbed":
    c = importlib.import_module("configs.testbed_cpu").get_config()
  elif name == "testbed16":
    c = importlib.import_module("configs.testbed_cpu").get_config()
    c.model.hf_path = BASE16
    c.train.num_minibatches = 16       # updates per rollout step (the paper's 512 x 16 / 512)
    c.optim.lr = LR16
    c.eval.top_p = 1.0                 # the training sampler's: at top-p 0.7 this base scores
                                       # 90 % before RL (near-greedy), a ceiling
  elif name == "tiny":
    c = importlib.import_module("configs.tiny_cpu").get_config("ladder=True")
  elif name == "qwen25_32b":
    c = importlib.import_module("configs.dapo_qwen25_32b").get_config()
  else:
    raise ValueError(f"ladder: unknown base {name!r}; expected testbed, testbed16, tiny or "
                     "qwen25_32b")
  c.seed = seed
  return c


def apply_rung(c, rung: str):
  """Sets the four DAPO switches of a Table-1 rung on config c (in place)."""
  if rung not in RUNGS:
    raise ValueError(f"ladder: unknown rung {rung!r}; expected one of {RUNGS}")
  level = RUNGS.index(rung)
  a = c.algo
  a.overlong_filter = level in (1, 2)
  a.eps_high = 0.28 if level >= 2 else 0.2
  a.overlong_penalty = level >= 3
  a.loss_agg = "token-mean" if level >= 4 else "seq-mean-token-mean"
  a.dynamic_sampling = level >= 5
  return c


def apply_matched(c):
  """The token_level rung training on every prompt of a round as large as the dapo rung's
  (algo.gen_batch_size), at the same prompts per update, so with more updates (in place)."""
  apply_rung(c, "token_level")
  per_update = c.train.batch_size // c.train.num_minibatches  # prompts per optimizer update
  c.train.batch_size = c.algo.gen_batch_size   # prompts sampled and trained on each step
  c.train.num_minibatches = c.train.batch_size // per_update
  return c


def get_config(arg=None):
  opts = parse_arg(arg, rung="dapo", base="testbed", seed=0)
  c = _base(opts["base"], opts["seed"])
  return apply_matched(c) if opts["rung"] == "token_level_matched" else apply_rung(c, opts["rung"])


def variant_overrides() -> dict:
  """loss mode -> the overrides that run it: algo.loss_mode and the mode's default clip range."""
  from dapo_jax.core import loss_modes  # pylint: disable=g-import-not-at-top
  out = {}
  for mode, spec in loss_modes.MODES.items():
    clip = {f"algo.{k}": spec.defaults[k] for k in ("eps_low", "eps_high") if k in spec.defaults}
    out[mode] = {"algo.loss_mode": mode, **clip}
  return out


# The sampler's weights: bf16 (compute float32), or int8 with verl's token-level IS at 2.
INT8_ARMS = {"rollout_bf16": {"rollout.weight_dtype": "bfloat16"},
             "rollout_int8_is": {"rollout.weight_dtype": "int8", "algo.rollout_is": "token",
                                 "algo.rollout_is_threshold": "2.0"}}


def staleness_overrides(k: int) -> dict:
  """One arm of the staleness sweep: max_staleness k, partial rollouts when k >= 1, the
  token-level truncated IS correction on every arm (k = 0 included), and the sampler on half
  of the devices (split placement: with one device, or colocated, the sampler never gets more
  than one version ahead, so k >= 2 would equal k = 1), so only k differs."""
  return {"rollout.max_staleness": k, "rollout.partial": k >= 1,
          "algo.is_correction": "tis_token", "rollout.placement": "split",
          "rollout.sampler_devices": 0.5}


def get_sweep(arg=None):
  """Runs of a named sweep: a list of {name, arg, overrides} (arg goes after the config path).

  ladder: 6 rungs x SEEDS. eps_high: the DAPO rung with each EPS_HIGH x SWEEP_SEEDS. l_cache:
  the DAPO rung with overlong_cache_len = fraction x max_new_tokens (of the default base) x
  SWEEP_SEEDS. Both skip the point that is the DAPO rung's own value (eps_high 0.28, the base's
  L_cache): those runs are the ladder's dapo_s0..2, the same configuration, which the notebook
  reads in their place. beyond: the DAPO rung with algo.prefilter, then algo.overlong_adaptive,
  on x SWEEP_SEEDS (compared with the ladder's dapo runs). prefilter_pool: the
  DAPO rung on a pool of PREFILTER_POOL prompts x PREFILTER_ARMS (pre-filter off, on, on with
  a 0.1 margin) x SWEEP_SEEDS (the
  default pool is never revisited in 30 steps, so the pre-filter has no record to act on; the
  paper's run passes DAPO-Math-17k many times). loss_mode: the DAPO rung
  with each loss mode of core.loss_modes.MODES x SWEEP_SEEDS, its clip range the mode's own
  default where it has one (GSPO's 3e-4 / 4e-4 act on a sequence-level ratio; DAPO's 0.2 / 0.28 would not clip
  it). pilot16: the DAPO rung on base testbed16 with each PILOT_ARMS x PILOT_SEEDS. ladder16: the
  six rungs and token_level_matched on base testbed16 x SEEDS16, phase by phase
  (LADDER16_PHASES), each seed-major. testbed_confirm (or any campaign registered under
  REGISTRATIONS): the registration's arms on its base x its seeds, seed-major, each with its
  overrides. staleness: the DAPO rung with each STALENESS as
  rollout.max_staleness (`staleness_overrides`) x SWEEP_SEEDS. int8_rollout: the DAPO rung with
  each INT8_ARMS x SWEEP_SEEDS. eps_pilot: the DAPO rung with each EPS_PILOT setting x
  EPS_PILOT_ARMS (eps_high) x EPS_PILOT_SEEDS, seed-major (an exploratory pilot grid).
  lora_ranks: the DAPO rung with LoRA adapters of each LORA_RANKS at LORA_LR_FACTOR x its
  learning rate x SWEEP_SEEDS, seed-major (exploratory; the ladder's dapo_s* are its full-weight
  arm). lora_lr: the same at each LORA_LR_ARMS (rank, learning-rate factor) x SWEEP_SEEDS,
  seed-major (exploratory: at 10x the adapters moved the policy more per update than full
  weights did, by approx_kl; below and above it). Several names may be joined
  with ','.
  """
  names = (arg or "ladder").split(",")
  base = get_config()  # the DAPO rung on the default base: the sweeps' own points
  runs = []
  for name in names:
    if name == "ladder":
      runs += [{"name": f"{r}_s{s}", "arg": f"rung={r},seed={s}", "overrides": {}}
               for s in SEEDS for r in RUNGS]  # seed-major: a cut-short sweep stays paired
    elif name == "eps_high":
      runs += [{"name": f"eps_high{e:.2f}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {"algo.eps_high": e}}
               for e in EPS_HIGH if e != base.algo.eps_high for s in SWEEP_SEEDS]
    elif name == "l_cache":
      max_new = base.rollout.max_new_tokens
      runs += [{"name": f"lcache{f:.3f}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {"algo.overlong_cache_len": int(round(f * max_new))}}
               for f in L_CACHE_FRACTIONS
               if int(round(f * max_new)) != base.algo.overlong_cache_len for s in SWEEP_SEEDS]
    elif name == "beyond":  # beyond-the-paper ablations; their reference is the ladder's dapo runs
      runs += [{"name": f"{switch}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {f"algo.{switch}": True}}
               for switch in ("prefilter", "overlong_adaptive") for s in SWEEP_SEEDS]
    elif name == "prefilter_pool":
      runs += [{"name": f"pool{PREFILTER_POOL}_{arm}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {"task.num_train": PREFILTER_POOL, **o}}
               for s in SWEEP_SEEDS for arm, o in PREFILTER_ARMS.items()]
    elif name == "pilot16":
      runs += [{"name": f"{arm}_s{s}", "arg": f"rung=dapo,seed={s},base=testbed16",
                "overrides": o} for s in PILOT_SEEDS for arm, o in PILOT_ARMS.items()]
    elif name == "eps_pilot":  # exploratory: where does eps_high 0.28 vs 0.20 move entropy?
      runs += [{"name": f"{st}_eps{e:.2f}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {**o, "algo.eps_high": e}}
               for s in EPS_PILOT_SEEDS for st, o in EPS_PILOT.items() for e in EPS_PILOT_ARMS]
    elif name == "lora_ranks":  # exploratory: LoRA adapters of each rank vs the dapo_s* runs
      runs += [{"name": f"lora_r{r}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {"lora.rank": r, "optim.lr": LORA_LR_FACTOR * base.optim.lr}}
               for s in SWEEP_SEEDS for r in LORA_RANKS]
    elif name == "lora_lr":  # exploratory: the adapters' learning rate per rank
      runs += [{"name": f"lora_r{r}_lr{f}x_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": {"lora.rank": r, "optim.lr": f * base.optim.lr}}
               for s in SWEEP_SEEDS for r, f in LORA_LR_ARMS]
    elif name == "ladder16":
      runs += [{"name": f"{r}_s{s}", "arg": f"rung={r},seed={s},base=testbed16", "overrides": {}}
               for arms in LADDER16_PHASES for s in SEEDS16 for r in arms]
    elif name == "int8_rollout":
      runs += [{"name": f"{arm}_s{s}", "arg": f"rung=dapo,seed={s}", "overrides": o}
               for s in SWEEP_SEEDS for arm, o in INT8_ARMS.items()]
    elif name == "staleness":
      runs += [{"name": f"staleness{k}_s{s}", "arg": f"rung=dapo,seed={s}",
                "overrides": staleness_overrides(k)} for s in SWEEP_SEEDS for k in STALENESS]
    elif os.path.isfile(os.path.join(REGISTRATIONS, f"{name}.json")):
      from dapo_jax.analysis import confirm  # pylint: disable=g-import-not-at-top
      reg = confirm.load_registration(os.path.join(REGISTRATIONS, f"{name}.json"))
      if reg.raw["config"] != "configs/ladder.py":
        raise ValueError(f"ladder: registration {name!r} is for {reg.raw['config']}")
      runs += [{"name": f"{arm}_s{s}", "arg": f"rung={arm},seed={s},base={reg.raw['base']}",
                "overrides": dict(reg.raw["overrides"])} for s in reg.seeds for arm in reg.arms]
    elif name == "loss_mode":
      runs += [{"name": f"{m}_s{s}", "arg": f"rung=dapo,seed={s}", "overrides": o}
               for m, o in variant_overrides().items() for s in SWEEP_SEEDS]
    else:
      raise ValueError(f"ladder: unknown sweep {name!r}; expected ladder, eps_high, l_cache, "
                       "beyond, prefilter_pool, pilot16, ladder16, loss_mode, staleness, int8_rollout, "
                       "eps_pilot, lora_ranks, lora_lr, or "
                       "a campaign "
                       f"registered under {REGISTRATIONS}")
  return runs
