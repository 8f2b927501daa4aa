"""tf.train.Example records for a whole block of rows at once, without building protos.

Building a `tf.train.Example` per row (7-12 `Feature` messages, `.tolist()` of every array) cost
a fifth of data creation. Our rows are fixed-length int64/float32 features, so the protobuf wire
format is simple enough to write directly: varints are computed for the whole block with numpy
and each record is a join of byte slices. The bytes are identical to
`tf.train.Example(...).SerializeToString(deterministic=True)` (keys sorted; a test checks it),
so readers, TFRecord tools and the reference see ordinary Examples.
"""

from __future__ import annotations

import numpy as np

_MAX_VARINT_BYTES = 5  # values below 2**35: token ids, positions, lengths, labels


def _varint(n: int) -> bytes:
  out = bytearray()
  while True:
    byte, n = n & 0x7F, n >> 7
    out.append(byte | (0x80 if n else 0))
    if not n:
      return bytes(out)


_SMALL_VARINTS = [_varint(i) for i in range(1 << 14)]


def _v(n: int) -> bytes:
  return _SMALL_VARINTS[n] if n < (1 << 14) else _varint(n)


def _packed_varints(values: np.ndarray) -> tuple[bytes, np.ndarray]:
  """[N, L] non-negative ints -> (all rows' varint bytes concatenated, bytes per row)."""
  n, length = values.shape
  top = int(values.max(initial=0))
  if values.size and (int(values.min()) < 0 or top >= (1 << (7 * _MAX_VARINT_BYTES))):
    raise ValueError('example_codec writes non-negative ints below 2**35 only')
  if top < 0x80:  # masks, segment ids, labels, positions < 128: one byte each, as is
    return values.astype(np.uint8).tobytes(), np.full(n, length, np.int64)
  groups = max(1, (top.bit_length() + 6) // 7)
  v = values.astype(np.uint64 if groups > 4 else np.uint32)
  nbytes = np.ones(v.shape, np.int64)
  raw = np.empty(v.shape + (groups,), np.uint8)
  for k in range(groups):
    raw[..., k] = (v >> (7 * k)) & 0x7F
    if k:
      nbytes += v >= (1 << (7 * k))
  for k in range(groups - 1):
    raw[..., k] |= (nbytes > k + 1).astype(np.uint8) << 7
  keep = np.arange(groups) < nbytes[..., None]
  return raw[keep].tobytes(), nbytes.sum(-1)


def encode_examples(features: dict[str, np.ndarray]) -> list[bytes]:
  """{name: [N, L] int or float array} -> N serialized tf.train.Example records."""
  names = sorted(features)
  n = len(features[names[0]])
  columns = []  # per feature: (header for a payload size, payload bytes, per-row offsets)
  for name in names:
    values = features[name]
    if values.ndim != 2 or len(values) != n:
      raise ValueError(f'feature {name!r}: expected [{n}, L], got {values.shape}')
    if values.dtype.kind == 'f':
      payload = values.astype('<f4').tobytes()
      sizes = np.full(n, 4 * values.shape[1], np.int64)
      kind = b'\x12'  # Feature.float_list
    else:
      payload, sizes = _packed_varints(values)
      kind = b'\x1a'  # Feature.int64_list
    key = name.encode()
    offsets = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    headers: dict[int, bytes] = {}

    def header(size, key=key, kind=kind, headers=headers):
      # Features.feature map entry {key = 1, value = 2: Feature {kind: {value = 1, packed}}}
      if size not in headers:
        value_list_len = 1 + len(_v(size)) + size
        feature_len = 1 + len(_v(value_list_len)) + value_list_len
        key_field = b'\x0a' + _v(len(key)) + key
        entry_len = len(key_field) + 1 + len(_v(feature_len)) + feature_len
        headers[size] = (b'\x0a' + _v(entry_len) + key_field + b'\x12' + _v(feature_len) +
                         kind + _v(value_list_len) + b'\x0a' + _v(size))
      return headers[size]

    columns.append((header, payload, offsets))

  records = []
  for r in range(n):
    parts = []
    for header, payload, offsets in columns:
      start, end = offsets[r], offsets[r + 1]
      parts.append(header(end - start))
      parts.append(payload[start:end])
    body = b''.join(parts)
    records.append(b'\x0a' + _v(len(body)) + body)  # Example.features = 1
  return records
