"""One dapo_jax job in a workdir this process holds: the start checks, the build, training, then
the export, results.json and the report. `dapo_jax.main` is its command line."""
import json

import jax
from safetensors import SafetensorError

from dapo_jax import quiet, refusals
from dapo_jax.models import hf_io, lora, lora_export
from dapo_jax.workdir import paths, run_config, run_state


def _fmt(e: dict, key: str) -> str:
  return f"{100 * e[key]:.1f}% [95% CI {100 * e[key + '_ci_lo']:.1f}, {100 * e[key + '_ci_hi']:.1f}]"


def finished_results(workdir: str, num_steps: int) -> dict | None:
  """The results of a run in `workdir` that already did `num_steps` steps, else None."""
  path = paths.resolve(workdir) / "results.json"
  if not path.exists():
    return None
  try:
    results = json.loads(path.read_text())
    steps = results["steps"]
  except (ValueError, KeyError, TypeError) as e:
    raise refusals.Refusal(f"{path}: not a run's results ({refusals.one_line(repr(e))}); move "
                           f"it aside and rerun with --resume to finish the run again") from None
  return results if steps >= num_steps else None


def run_job(cfg, workdir: str, *, resume: bool, config_json: str):
  """The job in a workdir this process holds: the start checks, build, the config recorded,
  training, then the export and results (`finish`). Returns (the train.run.Run, results)."""
  start = run_config.check_start(cfg, workdir, resume=resume)
  quiet.import_tensorflow()  # before JetStream imports it: no CUDA / oneDNN start-up notices
  from dapo_jax.train import trainer  # pylint: disable=import-outside-toplevel
  run = trainer.build(cfg, workdir, resume=resume)
  if jax.process_index() == 0:  # every check passed: this start is the run's
    run_config.record_start(workdir, cfg, start, config_json=config_json)
    run_state.write(workdir, "running")
  results = trainer.train(run, resume=resume)
  if results.get("preempted"):
    print(f"[preempt] saved step {results['steps']} in {workdir}/checkpoints; exiting. Continue "
          f"with --resume", flush=True)
    if jax.process_index() == 0:
      run_state.write(workdir, "preempted", step=results["steps"], signal=results["signal"])
  else:
    finish(run, results, workdir)
  return run, results


def export(run, out: str) -> None:
  """The trained policy as an HF checkpoint in `out` (local or a bucket); a failed write is a
  Refusal naming `out` (the run's last checkpoint is intact, so --resume exports again)."""
  try:
    # Every process takes part (the params are gathered across hosts); process 0 writes.
    policy = lora.merge(run.model.graphdef, lora.join(run.loop.state.params, run.model.frozen))
    if run.model.frozen is not None:  # LoRA: the adapters in PEFT's format, then merged
      lora_export.write_adapter(policy, run.cfg.lora, run.model.base.path, f"{out}/adapter")
      policy = lora.merged_model(policy)
    hf_io.save_pretrained(policy, run.model.model_config, out, overwrite=True)
    if jax.process_index() == 0:
      with paths.staged_dir(out) as local:
        run.task.tokenizer.save_pretrained(local)
  except (OSError, SafetensorError) as e:
    why = refusals.os_error_text(e) if isinstance(e, OSError) else refusals.one_line(e)
    raise refusals.Refusal(
        f"export of the trained policy to {out} failed: {why}. The run's last checkpoint "
        f"(step {run.loop.step}) is intact: fix the cause (free space there) and rerun with "
        f"--resume to export again") from e
  if jax.process_index() == 0:
    print(f"[export] HF checkpoint: {out}")


def finish(run, results: dict, workdir: str) -> None:
  """A finished run's export (checkpoint.export_hf), results.json and report."""
  if run.cfg.checkpoint.export_hf:
    export(run, f"{workdir}/export")
  if jax.process_index() == 0:
    paths.write_text(f"{workdir}/results.json", json.dumps(results, indent=2))
    run_state.write(workdir, "finished", step=results["steps"])
    _report(results, run.cfg.eval.num_samples, workdir)


def _report(results: dict, k: int, workdir: str):
  if "before" in results:
    print(f"[eval] before: avg@{k} {_fmt(results['before'], f'avg@{k}')}")
  print(f"[eval] after:  avg@{k} {_fmt(results['after'], f'avg@{k}')}")
  print(f"[logs] {workdir}/metrics.jsonl, tensorboard in {workdir}/tensorboard")
