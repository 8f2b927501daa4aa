"""Training metrics to the workdir: `metrics.jsonl` and TensorBoard event files, on any path.

Both are written through the one file-system layer, so a gs:// workdir gets them too.
TensorFlow's summary writer cannot be used for that: it writes through TensorFlow's own GCS
client (see input_pipeline/fs.py). TensorBoard's event format is TFRecord-framed `Event`
protos, which `tfrecord.frame` and the protos that ship with TensorBoard give directly.

Object stores cannot append, so each flush rewrites the file whole (atomically): `metrics.jsonl`
holds every line so far (a resumed run reads it first and goes on), and each writer session has
its own event file, started afresh every `rotate_bytes` so a long run rewrites little.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import threading
import time

import jax
from tensorboard.compat.proto import event_pb2, summary_pb2

from input_pipeline import fs, tfrecord


class EventFile:
  """TensorBoard scalars, one event file per session part."""

  def __init__(self, logdir: str, rotate_bytes: int = 1 << 20):
    self._logdir, self._rotate_bytes = logdir, rotate_bytes
    self._part, self._path, self._data = 0, '', b''
    fs.makedirs(logdir)
    self._start_file()

  def _start_file(self):
    self._path = fs.join(self._logdir, 'events.out.tfevents.%d.%s.%d.%d' % (
        time.time(), socket.gethostname(), os.getpid(), self._part))
    self._part += 1
    version = event_pb2.Event(wall_time=time.time(), file_version='brain.Event:2')
    self._data = tfrecord.frame(version.SerializeToString())

  def scalars(self, step: int, values: dict[str, float]) -> None:
    if len(self._data) > self._rotate_bytes:
      self.flush()  # the finished part whole, once per rotate_bytes of events
      self._start_file()
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                         for k, v in values.items()])
    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
    self._data += tfrecord.frame(event.SerializeToString())

  def snapshot(self) -> 'EventFile':
    """A copy of the current file's path and bytes, to flush while more scalars arrive."""
    copy = EventFile.__new__(EventFile)
    copy.__dict__.update(self.__dict__)
    return copy

  def flush(self) -> None:
    fs.write_bytes(self._path, self._data)


class MetricWriter:
  """metrics.jsonl + TensorBoard events under workdir/tensorboard, written by process 0.

  Writes happen on a background thread (several writes that pile up become one): an upload
  to an object store takes tens of milliseconds, which the training loop must not wait for.
  `close()` flushes what is left and raises a write error, if any.
  """

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self._jsonl_path = fs.join(workdir, 'metrics.jsonl')
    self._lines = fs.read_text(self._jsonl_path) if fs.exists(self._jsonl_path) else ''
    self._events = EventFile(fs.join(workdir, 'tensorboard'))
    self._lock = threading.Lock()
    self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix='metrics')
    self._queued: concurrent.futures.Future | None = None
    self._last: concurrent.futures.Future | None = None

  def write(self, step: int, metrics: dict[str, float], prefix: str = '') -> None:
    if not self.active:
      return
    record = {'step': step, **{prefix + k: float(v) for k, v in metrics.items()}}
    with self._lock:
      self._lines += json.dumps(record) + '\n'
      self._events.scalars(step, {k: v for k, v in record.items() if k != 'step'})
      if self._queued is None:  # else the flush already queued will write this record too
        self._queued = self._last = self._pool.submit(self._flush)
    if self._last.done() and self._last.exception():
      raise self._last.exception()

  def _flush(self) -> None:
    with self._lock:
      self._queued = None
      lines, events = self._lines, self._events.snapshot()
    fs.write_text(self._jsonl_path, lines)
    events.flush()

  def close(self) -> None:
    if not self.active:
      return
    self._pool.shutdown(wait=True)
    if self._last is not None:
      self._last.result()


def read_metrics(workdir: str) -> list[dict]:
  """Every record of a workdir's metrics.jsonl."""
  path = fs.join(workdir, 'metrics.jsonl')
  return [json.loads(line) for line in fs.read_text(path).splitlines() if line.strip()]
