"""One way to fail: a refusal a user can cause ends with one `error: ...` line on stderr.

The line names the place (a config field, a file, a directory, a flag) and what to do. The
traceback is printed above it only with `--debug`; otherwise it is appended to
`<workdir>/errors.log` when the run holds its workdir (else only `--debug` shows it). Which errors
are a user's to act on: a ValueError (the project's bad-input error: config fields, data rows,
the seed, a resume), an OSError (a missing file, a full or read-only disk), a
checkpoint.CheckpointError, a dynamic-sampling shortfall and a `Refusal` raised for anything
else (a failed export). Anything else is a bug: the traceback stays, as Python prints it.
"""
import errno
import os
import re
import sys
import time
import traceback

from dapo_jax.workdir import paths

ERRORS_LOG = "errors.log"
# (module, class): refusals defined in modules that import JAX or orbax. Looked up only when
# the module is loaded (an error cannot be of a class not yet imported), so a config error
# never pays for importing them.
_LOADED_REFUSALS = (("dapo_jax.train.checkpoint", "CheckpointError"),
                    ("dapo_jax.train.dynamic_sampling", "DynamicSamplingError"))
_OS_HINTS = {
    errno.ENOSPC: "free space there (or use another --workdir) and rerun with --resume",
    errno.EDQUOT: "free space there (or use another --workdir) and rerun with --resume",
    errno.EACCES: "make it writable, or use another --workdir",
    errno.EPERM: "make it writable, or use another --workdir",
    errno.EROFS: "it is on a read-only file system: use another --workdir",
}


class Refusal(RuntimeError):
  """A stop a user must act on, whose message names the place and what to do."""


def one_line(text: str) -> str:
  return " ".join(part.strip() for part in str(text).strip().splitlines() if part.strip())


def _loaded_refusal(e: BaseException) -> bool:
  for module, name in _LOADED_REFUSALS:
    mod = sys.modules.get(module)
    if mod is not None and isinstance(e, getattr(mod, name)):
      return True
  return False


def os_error_text(e: OSError) -> str:
  """'<path>: <why>. <what to do>' for an OSError (its own message when it carries one)."""
  if e.filename is None or e.strerror is None:
    return one_line(e)
  where = os.fspath(e.filename)
  hint = _OS_HINTS.get(e.errno, "")
  return f"{where}: {e.strerror}" + (f". {hint.capitalize()}" if hint else "")


def error_line(e: BaseException) -> str | None:
  """The `error: ...` line for a refusal a user can act on; None for anything else."""
  if isinstance(e, Refusal) or _loaded_refusal(e):
    return f"error: {one_line(e)}"
  if isinstance(e, OSError):
    return f"error: {os_error_text(e)}"
  if isinstance(e, ValueError):
    text = one_line(e)
    if text.startswith("config") and "--resume" not in text:
      text += " (set it in the config file or with --config.<field>=...)"
    return f"error: {text}"
  return None


def flag_error_line(e: BaseException, argv=()) -> str:
  """The error line for a command line that cannot be parsed (absl / ml_collections errors);
  `argv` lets an override naming no field be quoted as it was typed."""
  text = str(e)
  if isinstance(e, AttributeError):  # a --config.<field> override naming no field
    guess = re.search(r'Did you mean "([^"]+)" instead of "([^"]+)"', text)
    name = guess.group(2) if guess else (re.findall(r"(\w+)", text) or ["?"])[0]
    typed = next((a.split("=")[0] for a in argv if re.search(rf"\.{name}(=|$)", a)),
                 f"--config.*.{name}")
    hint = f" (did you mean {guess.group(1)!r}?)" if guess else ""
    return f"error: {typed}: no such config field{hint}"
  missing = re.search(r"\[Errno 2\] No such file or directory: '([^']+)'", text)
  if missing:
    return (f"error: --config: no such file {missing.group(1)} (a path relative to "
            f"{os.getcwd()}, e.g. configs/tiny_cpu.py)")
  lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
  head = lines[0].rstrip(":") if lines else type(e).__name__
  if "Traceback" in text:  # the config file raised: its own last line says why
    return f"error: {head}: {lines[-1]}"
  return f"error: {head} (--helpfull lists the flags)"


def _append_traceback(e: BaseException, workdir) -> str | None:
  """Appends the traceback to <workdir>/errors.log; its path, or None if that failed."""
  path = paths.resolve(workdir) / ERRORS_LOG
  stamp = time.strftime("%Y-%m-%d %H:%M:%S %Z")
  text = f"--- {stamp}\n" + "".join(traceback.format_exception(e))
  try:
    paths.append_text(path, text)
  except OSError:  # the disk that is full may be this one
    return None
  return os.fspath(path)


def stop(e: BaseException, line: str, *, debug: bool, workdir=None) -> None:
  """Prints the traceback (stderr with `debug`, else <workdir>/errors.log when given) and
  `line` last on stderr, then ends the process with status 1 (os._exit: no thread of orbax or
  jax.distributed prints after it or waits for a peer that is gone)."""
  from dapo_jax.workdir import lock as run_lock  # pylint: disable=import-outside-toplevel
  if debug:
    traceback.print_exception(e)
  else:
    logged = _append_traceback(e, workdir) if workdir is not None else None
    print(f"[error] the traceback is in {logged} (--debug prints it here)" if logged else
          "[error] --debug prints the traceback", file=sys.stderr)
  run_lock.release_held()
  sys.stdout.flush()
  print(line, file=sys.stderr, flush=True)
  os._exit(1)
