"""A quiet start: TensorFlow's start-up notices kept off a run's console.

TensorFlow is imported only because tensorflow-datasets and seqio are (through JetStream); no
computation of a run uses it. On import it announces, on a machine without a GPU, that it found
no CUDA driver or that `cuInit` failed, that oneDNN and some CPU instructions are on, and that
"All log messages before absl::InitializeLog() is called are written to STDERR": lines that read
like failures before the first line of the run. Its own logging setting (TF_CPP_MIN_LOG_LEVEL=1,
INFO off; the value JAX sets too) is put in the environment first, but the lines written before
absl's C++ logging is set up ignore it. So `import_tensorflow` also imports it with file
descriptor 2 captured and writes back every captured line except the NOTICES below; anything
else TensorFlow (or Python) writes then still reaches stderr.
"""
import contextlib
import importlib.util
import os
import re
import sys
import tempfile

NOTICES = tuple(re.compile(p) for p in (
    r"All log messages before absl::InitializeLog\(\) is called are written to STDERR",
    r"cudart_stub\.cc:\d+\] Could not find cuda drivers",
    r"cuInit", r"cuda_diagnostics\.cc", r"Unable to register cu(DNN|FFT|BLAS) factory",
    r"computation placer already registered", r"oneDNN custom operations are on",
    r"cpu_feature_guard\.cc", r"^To enable the following instructions: .* rebuild TensorFlow",
    r"TF-TRT Warning: Could not find TensorRT"))


def is_notice(line: str) -> bool:
  return any(p.search(line) for p in NOTICES)


@contextlib.contextmanager
def filtered_stderr():
  """Captures file descriptor 2 (a file, so no pipe can fill up) and writes back all but the
  NOTICES lines at the end."""
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as tmp:
    os.dup2(tmp.fileno(), 2)
    try:
      yield
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      tmp.seek(0)
      kept = [ln for ln in tmp.read().decode("utf-8", "replace").splitlines()
              if not is_notice(ln)]
      if kept:
        sys.stderr.write("\n".join(kept) + "\n")
        sys.stderr.flush()


def import_tensorflow() -> None:
  """Sets TensorFlow's logging environment and imports it without its start-up notices (a
  no-op when it is imported already or not installed)."""
  os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
  if "tensorflow" in sys.modules or importlib.util.find_spec("tensorflow") is None:
    return
  with filtered_stderr():
    import tensorflow  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


LIBRARY_LOG = "library.log"  # the libraries' INFO lines of a run, in its (local) workdir


def library_info_off_console() -> None:
  """The libraries' INFO lines (orbax writes ~40 a checkpoint save; JAX's backend search) off
  the console: absl's console handler shows WARNING and above."""
  import logging  # pylint: disable=import-outside-toplevel
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  absl_logging.get_absl_handler().setLevel(logging.WARNING)


def keep_library_log(workdir: str) -> str | None:
  """Every INFO line from here on in <workdir>/library.log (process 0 of a run whose workdir is
  local; a bucket's stay off). Returns that file's path, or None."""
  import logging  # pylint: disable=import-outside-toplevel
  from absl import logging as absl_logging  # pylint: disable=import-outside-toplevel
  from dapo_jax.workdir import paths  # pylint: disable=import-outside-toplevel
  if paths.is_url(workdir):
    return None
  path = os.path.join(workdir, LIBRARY_LOG)
  handler = logging.FileHandler(path, encoding="utf-8")
  handler.setLevel(logging.INFO)
  handler.setFormatter(absl_logging.PythonFormatter())
  logging.getLogger().addHandler(handler)
  return path
