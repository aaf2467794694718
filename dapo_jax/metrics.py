"""Step metrics to a JSONL file, TensorBoard event files, wandb and a console line; health
warnings."""
import contextlib
import json
import logging
import math
import os
import time

import jax
import numpy as np

from dapo_jax import metrics_wandb
from dapo_jax.workdir import paths
from dapo_jax.core import stats

log = logging.getLogger("dapo_jax")


def to_float(v):
  v = np.asarray(v)
  return float(v) if v.size == 1 else float(v.mean())


class MetricWriter:
  """Writes one record per rollout step. Only process 0 writes (multi-host safe).

  `keep_records` repairs the log to a checkpoint: the first `keep_records` records of an
  existing metrics.jsonl stay, later ones (written after that checkpoint, before a kill) are
  dropped and counted in a log line, and TensorBoard hides events after the last kept step
  (its purge_step). 0 starts both logs afresh. `records` counts the records in the file.
  The workdir may be a bucket (gs://): there each record rewrites the file in one upload (an
  object store cannot append), locally it is appended and flushed. `wandb`: WandbSink's
  keywords (metrics_wandb.options), the same scalars as TensorBoard to a wandb run; None = off.
  """

  def __init__(self, workdir: str, *, tensorboard: bool, progress: bool, total_steps: int,
               keep_records: int, is_main: bool = True, filename: str = "metrics.jsonl",
               wandb: dict | None = None):
    self.is_main = is_main
    self.progress = progress and is_main
    self.total_steps = total_steps
    self.path = os.fspath(paths.resolve(workdir) / filename)
    self.records = keep_records
    self._tb = self._f = self._lines = self._wandb = None
    if is_main:
      paths.makedirs(workdir)
      self._lines = self._truncate(keep_records)
      last_step = json.loads(self._lines[-1])["step"] if self._lines else None
      if not paths.is_url(self.path):
        self._f, self._lines = open(self.path, "a", encoding="utf-8"), None
      if tensorboard:
        import tensorboardX  # pylint: disable=import-outside-toplevel
        self._tb = tensorboardX.SummaryWriter(
            paths.tensorboard_dir(paths.resolve(workdir) / "tensorboard"),
            purge_step=0 if last_step is None else last_step + 1)
      if wandb is not None:
        self._wandb = metrics_wandb.WandbSink(workdir, **wandb)
    self._t0 = time.time()

  def _truncate(self, keep: int) -> list[str]:
    """Keeps the first `keep` records of the file (atomically); returns them."""
    lines = []
    if paths.resolve(self.path).exists():
      lines = [ln for ln in paths.read_text(self.path).split("\n") if ln.strip()]
    if len(lines) < keep:  # the log was cut or replaced: resume anyway, and say so
      log.warning("%s: %d records, but the restored checkpoint was saved after record %d; "
                  "the earlier records are missing", self.path, len(lines), keep)
      self.records = len(lines)
    kept = lines[:keep]
    paths.write_text(self.path, "".join(ln + "\n" for ln in kept))
    if len(lines) > keep:
      print(f"[metrics] {self.path}: kept {keep} records, dropped {len(lines) - keep} written "
            f"after the restored checkpoint", flush=True)
    return kept

  def write(self, step: int, metrics: dict, *, kind: str = "train"):
    if not self.is_main:
      return
    rec = {"step": step, "kind": kind}
    for k, v in metrics.items():
      if isinstance(v, (str, bool)) or v is None:
        rec[k] = v
      elif isinstance(v, (list, tuple)):
        rec[k] = list(v)
      else:
        f = to_float(v)
        rec[k] = f if math.isfinite(f) else str(f)
    self._append(json.dumps(rec, sort_keys=True))
    self.records += 1
    scalars = {f"{kind}/{k.replace('@', '_at_')}": v for k, v in rec.items()
               if isinstance(v, float)}
    if self._tb is not None:
      for tag, v in scalars.items():
        self._tb.add_scalar(tag, v, step)
      for k, v in rec.items():
        if k.endswith("_counts") and isinstance(v, list) and sum(v) > 0:
          # counts[i] = how many had value i (e.g. staleness_counts): a histogram
          self._tb.add_histogram(f"{kind}/{k.removesuffix('_counts')}",
                                 np.repeat(np.arange(len(v)), v), step)
      self._tb.flush()
    if self._wandb is not None:
      self._wandb.log(step, scalars)
    if self.progress and kind == "train":
      self._console(step, rec)
    if self.is_main and kind == "train" and rec.get("prompts_truncated"):
      print(f"[data] step {step}: {rec['prompts_truncated']} prompt(s) longer than "
            f"task.max_prompt_len were cut at their start (prompts_truncated in metrics.jsonl)",
            flush=True)

  def _append(self, line: str):
    if self._f is not None:
      self._f.write(line + "\n")
      self._f.flush()
    else:  # a bucket: the whole file again, in one upload
      self._lines.append(line)
      paths.write_text(self.path, "".join(ln + "\n" for ln in self._lines))

  def _console(self, step, rec):
    width = 20
    done = int(width * step / max(self.total_steps, 1))
    bar = "#" * done + "-" * (width - done)
    keys = [("acc", "gen_accuracy"), ("rew", "reward_mean"), ("len", "response_length_mean"),
            ("ent", "entropy"), ("clip+", "clipfrac_upper"), ("rounds", "gen_rounds"),
            ("tok/s", "tokens_per_s")]
    parts = [f"{name} {rec[k]:.3g}" for name, k in keys if isinstance(rec.get(k), float)]
    print(f"[{bar}] step {step}/{self.total_steps} " + " | ".join(parts)
          + f" | {time.time() - self._t0:.0f}s", flush=True)

  def close(self):
    if self.is_main:
      if self._f is not None:
        self._f.close()
      if self._tb is not None:
        self._tb.close()
      if self._wandb is not None:
        self._wandb.close()


class HealthMonitor:
  """Warns on the failure signatures the paper reads: entropy collapse, entropy or length blow-up."""

  def __init__(self, *, entropy_floor: float, entropy_ceiling: float, length_growth: float):
    self.entropy_floor = entropy_floor
    self.entropy_ceiling = entropy_ceiling
    self.length_growth = length_growth
    self.first_length = None

  def check(self, step: int, metrics: dict) -> list[str]:
    warnings = []
    ent = metrics.get("entropy")
    if ent is not None and ent < self.entropy_floor:
      warnings.append(f"step {step}: entropy {ent:.3f} < floor {self.entropy_floor} "
                      f"(entropy collapse; consider a larger eps_high)")
    if ent is not None and ent > self.entropy_ceiling:
      warnings.append(f"step {step}: entropy {ent:.3f} > ceiling {self.entropy_ceiling}")
    length = metrics.get("response_length_mean")
    if length is not None:
      if self.first_length is None:
        self.first_length = max(length, 1e-9)
      elif length > self.length_growth * self.first_length:
        warnings.append(f"step {step}: mean response length {length:.1f} > "
                        f"{self.length_growth}x step-1's {self.first_length:.1f}")
    for w in warnings:
      log.warning(w)
    return warnings


class PhaseTimer:
  """Wall time of named phases: `with timer("update"): ...`, then `timer.metrics()`."""

  def __init__(self):
    self._t0 = time.perf_counter()
    self.seconds = {}

  @contextlib.contextmanager
  def __call__(self, name: str):
    t = time.perf_counter()
    try:
      yield
    finally:
      self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t

  def add(self, name: str, seconds: float) -> None:
    """A span measured elsewhere (an update dispatched here and seen to end later)."""
    self.seconds[name] = self.seconds.get(name, 0.0) + seconds

  def metrics(self) -> dict:
    out = {f"time_{k}_s": v for k, v in self.seconds.items()}
    out["time_step_s"] = time.perf_counter() - self._t0
    return out


# Update aux that are per-token fractions or means: combined across mini-batches weighted by each
# mini-batch's loss-token count (within a mini-batch train_step already weights micro-batches so).
TOKEN_WEIGHTED = ("clipfrac", "clipfrac_upper", "clipfrac_lower", "clipfrac_dual", "approx_kl",
                  "ratio_mean", "selected_frac", "is_corrected_frac", "is_logp_diff_abs_mean",
                  "is_outside_frac", "is_weight_mean", "rs_token_frac")


def combine_updates(step_metrics: list[dict]) -> dict:
  """Per-update metrics -> one record per rollout step, weighted as the quantities are."""
  w_tok = np.array([float(m["num_tokens"]) for m in step_metrics])
  w_up = np.array([float(m["num_upclipped"]) for m in step_metrics])
  out = {}
  for k in step_metrics[0]:
    v = np.array([float(m[k]) for m in step_metrics])
    if k in TOKEN_WEIGHTED or k.startswith("rs_") and k.endswith("_token_frac"):
      out[k] = float(v @ w_tok / max(w_tok.sum(), 1.0))
    elif k == "upclip_prob_mean":
      out[k] = float(v @ w_up / max(w_up.sum(), 1.0))
    elif k in ("num_tokens", "num_upclipped", "skipped"):
      out[k] = float(v.sum())
    elif k == "ratio_max":
      out[k] = float(v.max())
    elif k == "lr":  # the rate of the step's last update
      out[k] = float(v[-1])
    else:
      out[k] = float(v.mean())
  out["updates_skipped"] = out.pop("skipped")
  return out


def policy_lag(batch, prep, version: int, is_cap: float) -> dict:
  """How far the trained tokens lag the policy that trains on them, and how far the sampler's
  log-probs are from the trainer's on them (response tokens).

  staleness = version - the version that drew the token (0 in the synchronous loop):
  staleness_mean / _max, stale_token_frac (share > 0), staleness_counts (tokens per value).
  The sampler-vs-trainer gap (a bf16 sampler vs an f32 trainer, other kernels, a stale
  policy): mismatch_figures."""
  n, g, r = batch.versions.shape
  resp = np.arange(r)[None, None, :] < batch.lengths[:, :, None]
  lag = version - batch.versions[resp].astype(np.int64)
  out = {"staleness_mean": float(lag.mean()) if lag.size else 0.0,
         "staleness_max": float(lag.max()) if lag.size else 0.0,
         "stale_token_frac": float((lag > 0).mean()) if lag.size else 0.0,
         "staleness_counts": np.bincount(np.maximum(lag, 0)).tolist() if lag.size else []}
  out.update(mismatch_figures(prep.logp_BxS, prep.behav_logp_BxS, prep.resp_mask_BxS,
                              is_cap=is_cap))
  return out


MISMATCH_PERCENTILES = (50, 90, 99)


def mismatch_figures(trainer_logp, sampler_logp, mask, *, is_cap: float) -> dict:
  """The gap between the trainer's and the sampler's log-probs of the sampled tokens (host
  arrays; `mask` marks the tokens), delta = log pi_trainer - log pi_sampler per token:

  mismatch_k1 / _k3: KL(sampler || trainer) estimated on the sampled tokens, k1 = mean(-delta),
  k3 = mean(e^delta - delta - 1); mismatch_abs_p50 / _p90 / _p99 / _max: percentiles of |delta|
  (nats); mismatch_capped_frac: the share of tokens whose IS weight e^delta exceeds `is_cap`
  (what algo.is_correction="tis_token" truncates); mismatch_outside_frac: the share outside
  [1/is_cap, is_cap] (what "mask_token" drops). All 0 when no token is marked."""
  m = np.asarray(mask, bool)
  delta = (np.asarray(trainer_logp, np.float64) - np.asarray(sampler_logp, np.float64))[m]
  if not delta.size:  # one zero gap: every figure 0
    delta = np.zeros(1)
  a, log_cap = np.abs(delta), math.log(is_cap)
  out = {"mismatch_k1": float(np.mean(-delta)), "mismatch_k3": float(np.mean(np.expm1(delta)
                                                                            - delta))}
  out.update({f"mismatch_abs_p{q}": float(v)
              for q, v in zip(MISMATCH_PERCENTILES, np.percentile(a, MISMATCH_PERCENTILES))})
  out["mismatch_abs_max"] = float(a.max())
  out["mismatch_capped_frac"] = float(np.mean(delta > log_cap))
  out["mismatch_outside_frac"] = float(np.mean(a > log_cap))
  return out


def _masked_mean(x, mask) -> float:
  """On the host in float64 (core.stats.masked_mean takes numpy arrays as they are)."""
  return float(stats.masked_mean(np.asarray(x, np.float64), np.asarray(mask, np.float64)))


def rollout_metrics(batch, prep, step_metrics: list[dict], sampling_summary: dict,
                    timer: PhaseTimer, version: int, is_cap: float) -> dict:
  """The dashboard record of one rollout step (the paper's Figs. 2-7 quantities, host floats).

  batch: the kept Groups; prep: the trainer's Prepared layout; step_metrics: host dicts of the
  step's updates; sampling_summary: dynamic sampling's per-step summary (all rounds); version:
  the policy version the step trained (its number); is_cap: algo.is_cap (mismatch_figures)."""
  lengths = batch.lengths.astype(np.float64)
  tokens_generated = sampling_summary["gen_tokens"]  # all rounds, not only the kept groups
  out = {
      "reward_mean": float(batch.reward.mean()), "score_mean": float(batch.score.mean()),
      "accuracy": float(batch.correct.mean()),
      "response_length_mean": float(lengths.mean()), "response_length_max": float(lengths.max()),
      "response_length_p90": float(np.percentile(lengths, 90)),
      "truncated_frac": float(batch.truncated.mean()),
      "entropy": _masked_mean(prep.entropy_BxS, prep.resp_mask_BxS),
      "mean_token_prob": _masked_mean(np.exp(prep.logp_BxS), prep.resp_mask_BxS),
      "adv_abs_mean": float(np.abs(prep.adv_NxG).mean()),
      "tokens_generated": tokens_generated,
  }
  out.update(timer.metrics())
  out["tokens_per_s"] = tokens_generated / max(timer.seconds.get("rollout", 0.0), 1e-9)
  out.update(sampling_summary)
  out.update(combine_updates(step_metrics))
  out.update(policy_lag(batch, prep, version, is_cap))
  return out


def loggers(cfg, workdir: str, *, keep_records: int, first_length: float | None):
  """(MetricWriter, HealthMonitor) of a run; the writer cut back to `keep_records` records on a
  resume, the monitor continuing from the run's first-step length."""
  writer = MetricWriter(workdir, tensorboard=cfg.log.tensorboard, progress=cfg.log.progress,
                        total_steps=cfg.train.num_steps, keep_records=keep_records,
                        is_main=jax.process_index() == 0, wandb=metrics_wandb.options(cfg))
  health = HealthMonitor(entropy_floor=cfg.train.entropy_floor,
                         entropy_ceiling=cfg.train.entropy_ceiling,
                         length_growth=cfg.train.length_growth_warn)
  health.first_length = first_length
  return writer, health
