"""One path layer for what a run reads and writes, local or in a bucket (gs://, s3://).

Everything goes through etils.epath, the layer orbax itself uses, so a workdir, a checkpoint
directory, metrics.jsonl, TensorBoard, results.json, the export, an HF model directory and a data
dir may each be a local path or a URL. A URL is never made local: `resolve` makes a local path
absolute and leaves a URL as it is (`os.path.abspath("gs://b/x")` would give `<cwd>/gs:/b/x`).

Object stores have no appends and no renames that are atomic, but an upload is atomic by itself:
`write_text` replaces a local file through a temporary file and `os.replace`, and writes an
object in one upload.
"""
import contextlib
import io
import os
import shutil
import tempfile

from etils import epath


def is_url(path) -> bool:
  """Whether `path` names a location behind a URL scheme (gs://bucket/x), not a local file."""
  return "://" in os.fspath(path)


def resolve(path) -> epath.Path:
  """An epath.Path: a local path made absolute (~ expanded), a URL as it is."""
  path = os.fspath(path)
  return epath.Path(path if is_url(path) else os.path.abspath(os.path.expanduser(path)))


def as_str(path) -> str:
  """`resolve(path)` as the string a command line or another library takes."""
  return os.fspath(resolve(path))


def makedirs(path) -> epath.Path:
  path = resolve(path)
  path.mkdir(parents=True, exist_ok=True)
  return path


def read_text(path) -> str:
  return resolve(path).read_text()


def write_text(path, text: str) -> None:
  """Replaces `path` with `text` atomically: a reader sees the old file or the new one."""
  path = resolve(path)
  if is_url(path):
    path.write_text(text)  # one upload: atomic on an object store
    return
  tmp = path.parent / (path.name + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def append_text(path, text: str) -> None:
  """Adds `text` at the end of `path` (a bucket: the whole object again, in one upload)."""
  path = resolve(path)
  if is_url(path):
    old = path.read_text() if path.exists() else ""
    path.write_text(old + text)
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a", encoding="utf-8") as f:
    f.write(text)


def free_bytes(path) -> int | None:
  """Free bytes on the file system holding `path`; None for a bucket (no such limit)."""
  return None if is_url(path) else shutil.disk_usage(os.fspath(resolve(path))).free


def relative_files(root) -> list[str]:
  """Every file under `root`, as paths relative to it ('/'-separated), sorted."""
  root = resolve(root)
  base = os.fspath(root).rstrip("/")
  out = []
  for directory, _, names in root.walk():
    rel = os.fspath(directory)[len(base):].strip("/")
    out += [f"{rel}/{n}" if rel else n for n in names]
  return sorted(out)


def copy_file(src, dst) -> None:
  """Copies one file, each side through its own file system, in chunks (any pair of local
  paths and URLs)."""
  src, dst = resolve(src), resolve(dst)
  dst.parent.mkdir(parents=True, exist_ok=True)
  with src.open("rb") as fin, dst.open("wb") as fout:
    shutil.copyfileobj(fin, fout, 1 << 24)


def move_tree(src, dst) -> None:
  """Moves directory `src` to `dst` (a bucket: copied file by file, then removed)."""
  src, dst = resolve(src), resolve(dst)
  if not is_url(src):
    shutil.move(os.fspath(src), os.fspath(dst))
    return
  for rel in relative_files(src):
    copy_file(src / rel, dst / rel)
  src.rmtree()


def copy_to_local(src, names=None) -> str:
  """`src` itself when local; else a new local temporary directory holding the files of `src`
  (those in `names` when given, which may be missing). For small directories: tokenizers."""
  if not is_url(src):
    return os.fspath(resolve(src))
  src = resolve(src)
  out = tempfile.mkdtemp(prefix="dapo_jax_")
  wanted = [n for n in names if (src / n).exists()] if names is not None else [
      p.name for p in src.iterdir() if not p.is_dir()]
  for name in wanted:
    copy_file(src / name, os.path.join(out, name))
  return out


@contextlib.contextmanager
def staged_dir(dst):
  """A local directory to write into, whose files end up in `dst`: `dst` itself when local, else
  a temporary directory uploaded file by file on a clean exit (and removed either way)."""
  if not is_url(dst):
    yield os.fspath(makedirs(dst))
    return
  tmp = tempfile.mkdtemp(prefix="dapo_jax_stage_")
  try:
    yield tmp
    dst = makedirs(dst)
    for rel in relative_files(tmp):
      copy_file(os.path.join(tmp, rel), dst / rel)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)


class _ObjectWriter:
  """A file that keeps everything written and uploads all of it at each flush (an object store
  has no append; TensorBoard event files are small)."""

  def __init__(self, path: str):
    self._path = resolve(path)
    self._buffer = io.BytesIO()

  def write(self, data: bytes):
    self._buffer.write(data)

  def flush(self):
    self._path.write_bytes(self._buffer.getvalue())

  def close(self):
    self.flush()


class _ObjectWriterFactory:
  """tensorboardX's writer factory for a URL scheme: its event files through this layer."""

  def open(self, path: str):
    return _ObjectWriter(path)

  def directory_check(self, path: str):
    makedirs(path)


def tensorboard_dir(path) -> str:
  """The TensorBoard log directory `path` as tensorboardX takes it, with a URL's scheme routed
  through this layer (tensorboardX's own gs:// writer needs google-cloud-storage)."""
  path = os.fspath(resolve(path))
  if is_url(path):
    from tensorboardX import record_writer  # pylint: disable=import-outside-toplevel
    record_writer.register_writer_factory(path.split("://")[0], _ObjectWriterFactory())
  return path
