"""TFRecord files without TensorFlow's file system: written and read through `fs`.

The format is tiny: per record a little-endian uint64 length, the masked CRC-32C of those 8
bytes, the data, the masked CRC-32C of the data (CRC-32C from `google-crc32c`, Google's C
implementation). Files we write are byte-identical to `tf.io.TFRecordWriter`'s (a test checks
it) and appear only when complete (`fs.writer`).

Reading goes through `fs` too, because TensorFlow's GCS client cannot be pointed at anything but
Google's endpoints (see fs.py). `records_in_range` reads the records that *start* in a byte
range of a file, so a file splits into chunks that any process can read independently: the
first record of a chunk is found by scanning for a position where the length's CRC and the
data's CRC both check (a false match has probability 2^-64), which is how the previous chunk's
sequential walk ends. No index file is needed, so google-research/bert's files read unchanged.
"""

from __future__ import annotations

import struct

import google_crc32c
import numpy as np

from input_pipeline import fs

_MASK_DELTA = 0xA282EAD8
_HEADER = 12  # uint64 length + masked crc of it
_FOOTER = 4  # masked crc of the data
_READAHEAD = 1 << 14  # bytes read past a chunk's end for its last record (more on demand)
_U64, _U32 = struct.Struct('<Q'), struct.Struct('<I')
_SCAN = 1 << 12  # bytes scanned at a time for a chunk's first record
_LITTLE_ENDIAN = np.uint64(1) << (np.arange(8, dtype=np.uint64) * 8)


def _masked_crc(data: bytes) -> bytes:
  crc = google_crc32c.value(data)
  return struct.pack('<I', (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF)


def frame(record: bytes) -> bytes:
  """One record in TFRecord framing."""
  length = struct.pack('<Q', len(record))
  return length + _masked_crc(length) + record + _masked_crc(record)


class TFRecordWriter:
  """Write records to `path` (local or URL) atomically: `close()` publishes, `abort()` drops."""

  def __init__(self, path: str):
    self.path = path
    self._context = fs.writer(path, 'wb')
    self._file = self._context.__enter__()

  def write(self, record: bytes) -> None:
    self._file.write(frame(record))

  def write_many(self, records) -> None:
    self._file.write(b''.join(map(frame, records)))

  def close(self) -> None:
    self._context.__exit__(None, None, None)

  def abort(self) -> None:
    self._context.__exit__(_Aborted, _Aborted(), None)


class _Aborted(Exception):
  pass


class CorruptRecordError(ValueError):
  pass


class _Window:
  """Bytes of one file from `base` on, extended on demand with ranged reads."""

  def __init__(self, path: str, base: int, end: int, file_size: int):
    self.path, self.base, self.file_size = path, base, file_size
    self.data = fs.read_range(path, base, min(end + _READAHEAD, file_size))

  def ensure(self, stop: int) -> bool:
    """True when bytes [.., stop) are here (reading more if the file has them)."""
    have = self.base + len(self.data)
    if stop <= have:
      return True
    if stop > self.file_size:
      return False
    self.data += fs.read_range(self.path, have, min(max(stop, have + _READAHEAD),
                                                    self.file_size))
    return True

  def bytes(self, start: int, stop: int) -> bytes:
    return self.data[start - self.base:stop - self.base]


def _masked_crc_int(data) -> int:
  crc = google_crc32c.value(data)
  return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _record_at(window: _Window, p: int) -> bytes | None:
  """The record starting at absolute offset p, or None if p is not a record boundary. (The
  hot loop of reading: plain integer and slice work, no copies but the record's own.)"""
  i = p - window.base
  if i + _HEADER > len(window.data) and not window.ensure(p + _HEADER):
    return None
  data = window.data
  if _masked_crc_int(data[i:i + 8]) != _U32.unpack_from(data, i + 8)[0]:
    return None
  (length,) = _U64.unpack_from(data, i)
  stop = i + _HEADER + length + _FOOTER
  if stop > len(data):
    if not window.ensure(p + _HEADER + length + _FOOTER):
      return None
    data = window.data
  record = data[i + _HEADER:stop - _FOOTER]
  return record if _masked_crc_int(record) == _U32.unpack_from(data, stop - _FOOTER)[0] else None


def _first_boundary(window: _Window, start: int, end: int) -> int | None:
  """The first record boundary in [start, end), scanned in small steps (it is usually within
  one record of `start`): candidates whose length fits in the file are found vectorised, then
  confirmed by both CRCs."""
  for lo in range(start, end, _SCAN):
    hi = min(lo + _SCAN, end)
    window.ensure(min(hi + 8, window.file_size))
    raw = np.frombuffer(window.data, np.uint8)
    a, b = lo - window.base, min(hi - window.base, len(raw) - 8)
    if b <= a:
      return None
    octets = np.lib.stride_tricks.sliding_window_view(raw[a:b + 7], 8)
    lengths = octets.astype(np.uint64) @ _LITTLE_ENDIAN
    offsets = np.arange(lo, lo + (b - a))
    room = window.file_size - offsets - _HEADER - _FOOTER
    fits = (room >= 0) & (lengths <= np.maximum(room, 0).astype(np.uint64))
    for p in offsets[fits]:
      if _record_at(window, int(p)) is not None:
        return int(p)
  return None


def records_in_range(path: str, start: int, end: int, file_size: int) -> list[bytes]:
  """Every record of a TFRecord file whose first byte lies in [start, end)."""
  window = _Window(path, start, end, file_size)
  p = start if start == 0 else _first_boundary(window, start, end)
  records = []
  while p is not None and p < end and p < file_size:
    record = _record_at(window, p)
    if record is None:
      raise _corrupt(path, p)
    records.append(record)
    p += _HEADER + len(record) + _FOOTER
  if p is not None and end <= p < file_size and not _header_fits(window, p):
    # The next chunk's scan cannot tell a broken record from the inside of a long one: the
    # chunk whose walk reaches it says so.
    raise _corrupt(path, p)
  return records


def _header_fits(window: _Window, p: int) -> bool:
  if not window.ensure(p + _HEADER):
    return False
  i = p - window.base
  (length,) = _U64.unpack_from(window.data, i)
  return (_masked_crc_int(window.data[i:i + 8]) == _U32.unpack_from(window.data, i + 8)[0] and
          p + _HEADER + length + _FOOTER <= window.file_size)


def _corrupt(path: str, p: int) -> CorruptRecordError:
  return CorruptRecordError(
      f'{path}: not a valid TFRecord at byte {p} (length or CRC check failed): the file is '
      'corrupt, truncated or not a TFRecord file; re-create it with '
      'python -m input_pipeline.pretrain.create_pretraining_data')


def read_all(path: str) -> list[bytes]:
  """Every record of a file (tests, tools)."""
  return records_in_range(path, 0, fs.size(path), fs.size(path))
