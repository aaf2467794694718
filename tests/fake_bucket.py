"""A fake gs:// bucket for offline tests: `gs://<bucket>/<key>` is stored under a local root.

`install(monkeypatch, root)` routes etils.epath's gs:// backend (what dapo_jax.workdir.paths and orbax's
Python side use) and orbax's TensorStore kvstore for gs:// (its array data) to files under
`root`, with an object store's limits: no append. Any os-level call that would create or change
a file given a `gs:/` path fails (AssertionError), so code that turns a URL into a local path
(`os.path.abspath("gs://b")` -> `<cwd>/gs:/b`) or writes one with `open()` is caught rather than
silently writing a local copy; so does `shutil.disk_usage` (a wrong answer, silently). Queries
(`os.path.islink`, `stat`) pass: on a real bucket they fail or say False, as here (orbax asks).
"""
import builtins
import functools
import os
import shutil

from etils.epath import backend as epath_backend
from etils.epath import gpath

_GUARDED_OS = ("makedirs", "mkdir", "replace", "rename", "remove", "unlink", "rmdir")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT


def _check(args):
  for a in args[:2]:
    if isinstance(a, (str, bytes, os.PathLike)) and "gs:/" in str(os.fsdecode(a)):
      raise AssertionError(f"an os-level call was given the URL {a!r}")


def _guarded(fn):
  @functools.wraps(fn)
  def wrapper(*args, **kwargs):
    _check(args)
    return fn(*args, **kwargs)
  return wrapper


def _guarded_open(fn):
  @functools.wraps(fn)
  def wrapper(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+"):
      _check((file,))
    return fn(file, mode, *args, **kwargs)
  return wrapper


def _guarded_os_open(fn):
  @functools.wraps(fn)
  def wrapper(path, flags, *args, **kwargs):
    if flags & _WRITE_FLAGS:
      _check((path,))
    return fn(path, flags, *args, **kwargs)
  return wrapper


class FakeBucketBackend(epath_backend._OsPathBackend):  # pylint: disable=protected-access
  """epath's backend for gs://, storing each object as a file under `root`."""

  def __init__(self, root: str):
    self.root = root

  def local(self, path) -> str:
    path = os.fspath(path)
    if not path.startswith("gs://"):
      raise AssertionError(f"not a gs:// path: {path!r}")
    return os.path.join(self.root, path[len("gs://"):])

  def url(self, local) -> str:
    return "gs://" + os.path.relpath(os.fspath(local), self.root)

  def open(self, path, mode):
    if "a" in mode or "+" in mode:
      raise OSError(f"{path}: an object store cannot append ({mode!r})")
    local = self.local(path)
    if "w" in mode:
      os.makedirs(os.path.dirname(local), exist_ok=True)  # a bucket has no directories
    return super().open(local, mode)

  def exists(self, path):
    return super().exists(self.local(path))

  def isdir(self, path):
    return super().isdir(self.local(path))

  def listdir(self, path):
    return super().listdir(self.local(path))

  def glob(self, path):
    return [self.url(p) for p in super().glob(self.local(path))]

  def walk(self, top, *, top_down=True, on_error=None):
    for root, dirs, files in os.walk(self.local(top), topdown=top_down, onerror=on_error):
      yield self.url(root), dirs, files

  def makedirs(self, path, *, exist_ok=False, mode=None):
    return super().makedirs(self.local(path), exist_ok=exist_ok, mode=mode)

  def mkdir(self, path, *, exist_ok=False, mode=None):
    return super().mkdir(self.local(path), exist_ok=exist_ok, mode=mode)

  def rmtree(self, path):
    return super().rmtree(self.local(path))

  def remove(self, path):
    return super().remove(self.local(path))

  def rename(self, path, dst):
    return super().rename(self.local(path), self.local(dst))

  def replace(self, path, dst):
    return super().replace(self.local(path), self.local(dst))

  def copy(self, path, dst, overwrite):
    return super().copy(self.local(path), self.local(dst), overwrite=overwrite)

  def stat(self, path):
    return super().stat(self.local(path))


def install(monkeypatch, root) -> FakeBucketBackend:
  """Routes gs:// to files under `root` for the test's duration (see the module doc)."""
  from orbax.checkpoint._src.path import gcs_utils  # pylint: disable=import-outside-toplevel
  backend = FakeBucketBackend(os.fspath(root))
  monkeypatch.setattr(gpath, "_is_tf_installed", lambda: False)
  monkeypatch.setitem(gpath._PREFIX_TO_BACKEND, "gs", backend)  # pylint: disable=protected-access
  monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs",
                      lambda path: {"driver": "file", "path": backend.local(path)})
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda path: False)
  monkeypatch.setattr(builtins, "open", _guarded_open(builtins.open))
  monkeypatch.setattr(os, "open", _guarded_os_open(os.open))
  for name in _GUARDED_OS:
    monkeypatch.setattr(os, name, _guarded(getattr(os, name)))
  monkeypatch.setattr(shutil, "disk_usage", _guarded(shutil.disk_usage))
  return backend
