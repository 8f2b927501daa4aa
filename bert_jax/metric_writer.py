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

import json
import os
import socket
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
      self._start_file()
    summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=k, simple_value=v)
                                         for k, v in values.items()])
    event = event_pb2.Event(wall_time=time.time(), step=step, summary=summary)
    self._data += tfrecord.frame(event.SerializeToString())

  def flush(self) -> None:
    fs.write_bytes(self._path, self._data)


class MetricWriter:
  """metrics.jsonl + TensorBoard events under workdir/tensorboard, written by process 0."""

  def __init__(self, workdir: str):
    self.active = jax.process_index() == 0
    if not self.active:
      return
    self._jsonl_path = fs.join(workdir, 'metrics.jsonl')
    self._lines = fs.read_text(self._jsonl_path) if fs.exists(self._jsonl_path) else ''
    self._events = EventFile(fs.join(workdir, 'tensorboard'))

  def write(self, step: int, metrics: dict[str, float], prefix: str = '') -> None:
    if not self.active:
      return
    record = {'step': step, **{prefix + k: float(v) for k, v in metrics.items()}}
    self._lines += json.dumps(record) + '\n'
    fs.write_text(self._jsonl_path, self._lines)
    self._events.scalars(step, {k: v for k, v in record.items() if k != 'step'})
    self._events.flush()

  def close(self) -> None:
    pass


def read_metrics(workdir: str) -> list[dict]:
  """Every record of a workdir's metrics.jsonl."""
  path = fs.join(workdir, 'metrics.jsonl')
  return [json.loads(line) for line in fs.read_text(path).splitlines() if line.strip()]
