"""python -m dapo_jax.aot --config=CONFIG --topology=v5p-128 [--json=FILE] [--config.x.y=...]"""
import json
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Compile-only use: several processes (a test beside a check) may load libtpu at once.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

from absl import app, flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

flags.DEFINE_string("topology", None, "TPU slice, e.g. v5p-128, v5e-256, v6e-64, v4-128.")
flags.DEFINE_string("json", None, "Write the report here as JSON.")
flags.DEFINE_list("functions", [], "Compile only these (e.g. train_step,old_logprobs); "
                  "default all. The verdict then covers only them.")
config_flags.DEFINE_config_file("config", None, "A configs/*.py file.", lock_config=True)
flags.mark_flags_as_required(["config", "topology"])
FLAGS = flags.FLAGS


def main(argv):
  del argv
  from dapo_jax import aot, config as config_lib  # pylint: disable=import-outside-toplevel
  try:
    cfg = config_lib.parse(FLAGS.config, config_flags.get_override_values(FLAGS["config"]))
    out = aot.check(cfg, FLAGS.topology, only=FLAGS.functions)
  except ValueError as err:
    print(f"error: {err}", file=sys.stderr)
    return 2
  if out["placement"] == "split":
    print(f"[aot] split placement: {out['trainer_chips']} trainer chips, "
          f"{out['sampler_chips']} sampler chips")
  print(f"[aot] {out['topology']}: {out['chips']} chips, {out['hosts']} hosts; model "
        f"{out['num_params'] / 1e9:.2f} B params ({out['model_source']}); trainer mesh "
        f"{out['trainer_mesh']}, sampler per host {out['sampler_mesh_per_host']} with "
        f"{out['sampler_slots_per_host']} slots ({out['sampler_slots_global']} in all)"
        + (f"; paged KV cache: {out['pool_pages_per_host']} pages of {out['page_size']} tokens "
           "per host" if out["paged_kv"] else "; dense KV cache"))
  print(out["table"])
  if out["partial"]:
    print(f"[aot] partial check: only {', '.join(f['name'] for f in out['functions'])}")
  if FLAGS.json:
    with open(FLAGS.json, "w", encoding="utf-8") as f:
      json.dump({k: v for k, v in out.items() if k != "table"}, f, indent=2)
  return 0 if out["fits"] else 1


if __name__ == "__main__":
  app.run(main)
