"""The one file-system layer: every path the project reads or writes goes through here.

A path is a local path or a URL (`gs://bucket/dir`, or any scheme fsspec knows: `memory://`,
`s3://` with s3fs...). On a TPU pod the workdir and the data live on gs://, since a worker's
local disk is neither shared with the other hosts nor kept after preemption.

Why fsspec/gcsfs and not `tf.io.gfile`: TensorFlow's GCS client has Google's endpoints compiled
in, so nothing but a real bucket can exercise it; gcsfs (like every Google client library)
honours `STORAGE_EMULATOR_HOST`, so the code a pod runs is the code the tests run against a
local GCS emulator. The other two GCS clients in the process are pointed the same way, here and
nowhere else: Orbax's paths (etils.epath) use fsspec instead of TensorFlow
(`EPATH_USE_TF=false`), and TensorStore, which writes Orbax's arrays, gets the emulator through
its own variable (`TENSORSTORE_GCS_HTTP_URL`) derived from `STORAGE_EMULATOR_HOST`. This module
is in `input_pipeline/` because it is the lowest layer: `bert_jax/` imports it, never the
reverse.

Writes are atomic: a local file is written to a temporary sibling and renamed into place; an
object store publishes an object only when its upload completes. A reader never sees half a file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import glob as local_glob
import io
import os
import posixpath
import shutil
import sys
import tempfile
from typing import IO, Iterator

_GCS_HELP = ('check the bucket name and that this machine\'s service account may use it '
             '(gcloud storage ls gs://BUCKET)')


def configure_clients() -> None:
  """Point Orbax's and TensorStore's GCS clients where gcsfs goes (idempotent, cheap)."""
  os.environ.setdefault('EPATH_USE_TF', 'false')
  # gcsfs otherwise probes every bucket over gRPC for "zonal" storage: 60 s per bucket where
  # that API is unreachable (an emulator), for a feature standard buckets do not have.
  os.environ.setdefault('GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT', 'false')
  emulator = os.environ.get('STORAGE_EMULATOR_HOST')
  if emulator:
    if '://' not in emulator:
      emulator = 'http://' + emulator
    os.environ['TENSORSTORE_GCS_HTTP_URL'] = emulator


configure_clients()


def is_url(path: str) -> bool:
  return '://' in str(path)


def join(base: str, *parts: str) -> str:
  base = os.fspath(base)
  return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def absolute(path: str) -> str:
  """Local paths made absolute (a resumed run may start elsewhere); URLs unchanged."""
  path = os.fspath(path)
  return path if is_url(path) else os.path.abspath(path)


def dirname(path: str) -> str:
  return posixpath.dirname(path) if is_url(path) else os.path.dirname(path)


def basename(path: str) -> str:
  return posixpath.basename(path.rstrip('/')) if is_url(path) else os.path.basename(path)


def _filesystem(path: str):
  """(fsspec filesystem, path in its own terms) for a local path or URL."""
  import fsspec  # pylint: disable=g-import-not-at-top  # 0.3 s; local-only runs skip it
  configure_clients()
  options = {}
  protocol = path.split('://', 1)[0] if is_url(path) else 'file'
  if protocol in ('gs', 'gcs'):
    # Other hosts write into the same workdir: never answer from a stale listing.
    options['cache_timeout'] = 0
    if os.environ.get('STORAGE_EMULATOR_HOST'):
      options['token'] = 'anon'  # an emulator takes no credentials (as Google's clients do)
  return fsspec.core.url_to_fs(path, **options)


def _url(fs, path: str) -> str:
  """A filesystem's own path back as the URL the user would write."""
  protocol = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
  if protocol in ('file', 'local'):
    return path
  return fs.unstrip_protocol(path) if protocol != 'gcs' else 'gs://' + path


@contextlib.contextmanager
def _reported(path: str, action: str) -> Iterator[None]:
  """Storage errors as one line that names the path, what failed and what to do."""
  try:
    yield
  except FileNotFoundError as e:
    raise FileNotFoundError(f'{path}: cannot {action}: no such file, directory or bucket; '
                            + (_GCS_HELP if is_url(path) else
                               'check the path, or choose a location you can write to')) from e
  except PermissionError as e:
    raise PermissionError(f'{path}: cannot {action}: permission denied; '
                          + (_GCS_HELP if is_url(path) else 'check the directory\'s owner and '
                             'mode, or choose another location')) from e
  except IsADirectoryError as e:
    raise IsADirectoryError(f'{path}: cannot {action}: it is a directory') from e
  except OSError as e:
    if isinstance(e, (FileExistsError, NotADirectoryError)) or getattr(e, 'errno', None):
      raise OSError(f'{path}: cannot {action}: {e.strerror or e}') from e
    raise OSError(f'{path}: cannot {action}: {e}'
                  + (f'; {_GCS_HELP}' if is_url(path) else '')) from e


def exists(path: str) -> bool:
  if not is_url(path):
    return os.path.exists(path)
  fs, p = _filesystem(path)
  with _reported(path, 'look up'):
    return fs.exists(p)


def isdir(path: str) -> bool:
  if not is_url(path):
    return os.path.isdir(path)
  fs, p = _filesystem(path)
  with _reported(path, 'look up'):
    return fs.isdir(p)


def makedirs(path: str) -> None:
  """A directory (and parents); object stores have no directories, so there a no-op."""
  if is_url(path):
    return
  with _reported(path, 'create the directory'):
    os.makedirs(path, exist_ok=True)


def glob(pattern: str) -> list[str]:
  """Sorted matches of a glob, as URLs when the pattern is one."""
  if not is_url(pattern):
    return sorted(local_glob.glob(pattern))
  fs, p = _filesystem(pattern)
  with _reported(pattern, 'list'):
    return sorted(_url(fs, m) for m in fs.glob(p))


def listdir(path: str) -> list[str]:
  """Names (not paths) in a directory, sorted."""
  if not is_url(path):
    with _reported(path, 'list'):
      return sorted(os.listdir(path))
  fs, p = _filesystem(path)
  with _reported(path, 'list'):
    return sorted(posixpath.basename(e.rstrip('/')) for e in fs.ls(p, detail=False))


def size(path: str) -> int:
  if not is_url(path):
    with _reported(path, 'read'):
      return os.path.getsize(path)
  fs, p = _filesystem(path)
  with _reported(path, 'read'):
    return int(fs.size(p))


def sizes(paths: list[str]) -> list[int]:
  """Sizes of many files, looked up concurrently (one request each on an object store)."""
  if not any(is_url(p) for p in paths):
    return [size(p) for p in paths]
  with concurrent.futures.ThreadPoolExecutor(16) as pool:
    return list(pool.map(size, paths))


def remove(path: str) -> None:
  if not is_url(path):
    os.remove(path)
    return
  fs, p = _filesystem(path)
  with _reported(path, 'delete'):
    fs.rm(p)


def rmtree(path: str) -> None:
  if not is_url(path):
    shutil.rmtree(path, ignore_errors=True)
    return
  fs, p = _filesystem(path)
  if fs.exists(p):
    with _reported(path, 'delete'):
      fs.rm(p, recursive=True)


def open_read(path: str, mode: str = 'rb', encoding: str | None = None) -> IO:
  """A file opened for reading ('rb' or 'r')."""
  if mode not in ('r', 'rb'):
    raise ValueError(f'open_read mode {mode!r}: use writer() to write')
  if not is_url(path):
    with _reported(path, 'read'):
      return open(path, mode, encoding=encoding if 'b' not in mode else None)
  fs, p = _filesystem(path)
  with _reported(path, 'read'):
    f = fs.open(p, 'rb')
  return io.TextIOWrapper(f, encoding=encoding or 'utf-8') if mode == 'r' else f


def read_bytes(path: str) -> bytes:
  with open_read(path) as f, _reported(path, 'read'):
    return f.read()


def read_text(path: str, encoding: str = 'utf-8') -> str:
  return read_bytes(path).decode(encoding)


def read_range(path: str, start: int, end: int) -> bytes:
  """Bytes [start, end) of a file (fewer at its end): one ranged request on an object store."""
  if not is_url(path):
    with _reported(path, 'read'), open(path, 'rb') as f:
      f.seek(start)
      return f.read(max(end - start, 0))
  fs, p = _filesystem(path)
  with _reported(path, 'read'):
    return fs.cat_file(p, start=start, end=end)


def process_umask() -> int:
  """This process's umask, read without changing it (os.umask can only set it, and setting it
  twice races with other threads creating files); /proc has it on Linux."""
  with contextlib.suppress(OSError, ValueError):
    with open('/proc/self/status') as f:
      for line in f:
        if line.startswith('Umask:'):
          return int(line.split()[1], 8)
  umask = os.umask(0o022)
  os.umask(umask)
  return umask


@contextlib.contextmanager
def writer(path: str, mode: str = 'wb', encoding: str = 'utf-8') -> Iterator[IO]:
  """A file to write, published only when the block exits without an exception."""
  if mode not in ('w', 'wb'):
    raise ValueError(f'writer mode {mode!r}: expected "w" or "wb"')
  text = mode == 'w'
  if not is_url(path):
    directory = os.path.dirname(os.path.abspath(path))
    with _reported(path, 'write'):
      if not os.path.isdir(directory):
        raise FileNotFoundError(directory)
      fd, tmp = tempfile.mkstemp(prefix='.' + os.path.basename(path) + '.', suffix='.tmp',
                                 dir=directory)
    # mkstemp's 0600 would survive the rename: results, configs and exports shared with a
    # team get the mode open() would give them.
    os.fchmod(fd, 0o666 & ~process_umask())
    try:
      with os.fdopen(fd, mode, encoding=encoding if text else None) as f:
        yield f
      os.replace(tmp, path)
    except BaseException:
      with contextlib.suppress(OSError):
        os.remove(tmp)
      raise
    return
  fs, p = _filesystem(path)
  with _reported(path, 'write'):
    raw = fs.open(p, 'wb')
  f = io.TextIOWrapper(raw, encoding=encoding) if text else raw
  try:
    yield f
  except BaseException:
    # Object stores upload on close (or on garbage collection): cancel the upload and mark
    # the file closed, so nothing half-written is ever published.
    with contextlib.suppress(Exception):
      raw.discard()
    with contextlib.suppress(Exception):
      raw.closed = True
    raise
  with _reported(path, 'write'):
    f.close()


def write_bytes(path: str, data: bytes) -> None:
  with writer(path, 'wb') as f:
    f.write(data)


def write_text(path: str, text: str) -> None:
  write_bytes(path, text.encode('utf-8'))


def check_writable(directory: str) -> None:
  """Fail now, naming the directory, rather than after hours of work that cannot be saved."""
  makedirs(directory)
  probe = join(directory, f'.write_probe.{os.getpid()}')
  write_bytes(probe, b'')
  remove(probe)


def upload_dir(local_dir: str, target: str) -> None:
  """Copy a local directory tree to `target` (a local path or URL), file by file."""
  for root, _, files in os.walk(local_dir):
    rel = os.path.relpath(root, local_dir)
    for name in files:
      dest = join(target, name) if rel == '.' else join(target, *rel.split(os.sep), name)
      if not is_url(dest):
        os.makedirs(os.path.dirname(dest), exist_ok=True)
      with open(os.path.join(root, name), 'rb') as f:
        write_bytes(dest, f.read())


def download_dir(source: str, local_dir: str) -> None:
  """Copy every file under `source` into `local_dir` (relative layout kept)."""
  if not is_url(source):
    shutil.copytree(source, local_dir, dirs_exist_ok=True)
    return
  fs, p = _filesystem(source)
  with _reported(source, 'read'):
    files = [f for f in fs.find(p)]
  for f in files:
    rel = posixpath.relpath(f, p)
    dest = os.path.join(local_dir, *rel.split('/'))
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    with open(dest, 'wb') as out:
      out.write(read_bytes(_url(fs, f)))


def publish_dir(path: str, write, *, overwrite: bool = False, last: str = 'config.json') -> str:
  """Build a directory with `write(local_dir)` and publish it at `path` (local or URL); returns
  `path`. Locally it is built in a sibling temporary directory and renamed into place, so a
  failure leaves no half-written directory and an existing one intact. On an object store,
  where a directory cannot be renamed, the files are uploaded one by one with `last` at the
  end: a reader that finds it finds the rest."""
  path = absolute(path)
  if exists(path) and not overwrite and listdir(path):
    raise FileExistsError(f'{path} exists and is not empty; pass overwrite=True or choose '
                          'another directory')
  if is_url(path):
    with tempfile.TemporaryDirectory(prefix='bert_jax_publish_') as tmp:
      write(tmp)
      for name in sorted(os.listdir(tmp), key=lambda n: n == last):
        with open(os.path.join(tmp, name), 'rb') as f:
          write_bytes(join(path, name), f.read())
    return path
  parent = os.path.dirname(path)
  makedirs(parent)
  tmp = tempfile.mkdtemp(prefix='.publish-', dir=parent)
  umask = process_umask()
  os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would hide the export from other users
  try:
    write(tmp)
    file_mode = 0o666 & ~umask
    for name in os.listdir(tmp):  # libraries that write 0600 (safetensors' save_file) too
      if os.path.isfile(os.path.join(tmp, name)):
        os.chmod(os.path.join(tmp, name), file_mode)
    old = None
    if os.path.exists(path):
      old = tempfile.mkdtemp(prefix='.old-', dir=parent)
      os.rename(path, os.path.join(old, 'x'))
    os.rename(tmp, path)
    if old:
      shutil.rmtree(old, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return path


@contextlib.contextmanager
def staged_dir(target: str) -> Iterator[str]:
  """A local directory for a library that writes only local files (TF checkpoints, the
  profiler), uploaded to `target` when the block ends without an exception."""
  if not is_url(target):
    makedirs(target)
    yield target
    return
  with tempfile.TemporaryDirectory(prefix='bert_jax_stage_') as tmp:
    yield tmp
    upload_dir(tmp, target)


@contextlib.contextmanager
def local_dir(source: str) -> Iterator[str]:
  """`source` as a local directory (downloaded to a temporary one when it is a URL)."""
  if not is_url(source):
    yield source
    return
  with tempfile.TemporaryDirectory(prefix='bert_jax_fetch_') as tmp:
    download_dir(source, tmp)
    yield tmp


def main(argv: list[str]) -> int:
  """`python -m input_pipeline.fs cp SRC DST`: one file between any two paths (launch scripts
  use it to put worker logs into a gs:// workdir without gsutil)."""
  if len(argv) != 4 or argv[1] != 'cp':
    print('usage: python -m input_pipeline.fs cp SRC DST', file=sys.stderr)
    return 2
  try:
    dest = argv[3]
    if not is_url(dest) and dirname(dest):
      makedirs(dirname(dest))
    write_bytes(dest, read_bytes(argv[2]))
  except OSError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  return 0


if __name__ == '__main__':
  sys.exit(main(sys.argv))
