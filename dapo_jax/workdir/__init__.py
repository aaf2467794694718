"""A run's working directory, local or in a bucket (gs://...).

  paths               every file access (etils.epath): local paths and URLs alike
  remote_safetensors  safetensors behind a URL, read by blocks of rows without a local copy
  run_config          the config a run started with, its start history, what a resume may change
  lock                `<workdir>/run.lock`: one live process per workdir, with a heartbeat
  run_state           `<workdir>/state.json`: how the last start ended
"""
