"""cuDNN's fused attention as bert_jax/model/attention.py feeds it, against the xla cores, on
one GPU: forward and q/k/v gradients in bfloat16, and the cuDNN calls each compiled function
holds (so a silent fallback shows). The CPU tests check the rules and the arguments (through
jax's xla implementation of the same call); only a GPU runs the kernel.

  python benchmarks/cudnn_parity.py [xla]  # ~1 minute of compiles (xla: a CPU smoke run);
                                          # benchmarks/gpu_attention.py runs it first

Cases (4 rows, 4 heads of 64): unpacked 512-token rows padded to 300, 512, 129 and 0 real
tokens (key lengths; the all-padding row is not compared: no loss reads it), packed 512-token
rows (the dense mask), and a 1,024-token local layer of window 128 (chunks), unpacked padded
and packed. Compared where a loss can read (tests/test_attention_impl.py `visible`: queries
with an allowed key), against bfloat16's tolerance there (1.6e-2 on O(1) values: two ulps).
"""

from __future__ import annotations

import json

import gpu_step
import jax
import jax.numpy as jnp
import numpy as np

from bert_jax.model import attention as attn

TOL = 1.6e-2
BATCH, HEADS, DIM = 4, 4, 64


def _rows(length: int, packed: bool) -> np.ndarray:
  """[B, S] token groups: padded rows (real lengths 300/512/129/0 of 512, scaled), or packed
  instances crossing 128-token edges and ending in padding."""
  i = np.arange(length)
  if not packed:
    real = [length * r // 512 for r in (300, 512, 129, 0)]
    return np.stack([(i < n).astype(np.int32) for n in real])
  edges = [(0, 100, 1), (100, 300, 2), (300, length - 40, 3)]
  row = np.zeros(length, np.int32)
  for start, end, seg in edges:
    row[start:end] = seg
  return np.stack([row, np.roll(row, 50), np.where(i < length // 2, 1, 2), row])


def _case(length: int, packed: bool, half_window: int | None, impl: str = 'cudnn') -> dict:
  groups = jnp.asarray(_rows(length, packed))
  input_mask, segs = (None, groups) if packed else (groups, None)
  mask = attn.attention_mask(input_mask, segs, BATCH, length)
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (BATCH, length, HEADS, DIM)).astype(jnp.bfloat16)
             for key in keys)
  allowed = jnp.broadcast_to(mask[:, 0], (BATCH, length, length))
  if half_window is not None:
    allowed = allowed & attn.band(length, half_window)[None]
  readable = allowed.any(-1)[..., None, None]
  cot = jnp.sin(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape)) * readable

  def run(impl):
    def f(q, k, v):
      if half_window is None:
        return attn.global_attention(q, k, v, mask, implementation=impl, groups=groups,
                                     packed=packed)
      return attn.local_attention(q, k, v, mask, groups, half_window=half_window,
                                  packed=packed, implementation=impl)
    loss = lambda q, k, v: (f(q, k, v).astype(jnp.float32) * cot).sum()
    fn = jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)))
    compiled = fn.lower(q, k, v).compile()
    return compiled(q, k, v), gpu_step.fused_attention(compiled)

  (out_c, grads_c), calls = run(impl)
  (out_x, grads_x), _ = run('xla')
  f32 = lambda x: x.astype(jnp.float32)
  diffs = [float(jnp.max(jnp.abs(f32(out_c) - f32(out_x)) * readable))]
  diffs += [float(jnp.max(jnp.abs(f32(a) - f32(b)))) for a, b in zip(grads_c, grads_x)]
  return dict(length=length, packed=packed, half_window=half_window,
              max_abs_diff={'out': diffs[0], 'dq': diffs[1], 'dk': diffs[2], 'dv': diffs[3]},
              cudnn_fmha_forward=calls['cudnn_fmha_forward'],
              cudnn_fmha_backward=calls['cudnn_fmha_backward'],
              ok=all(d <= TOL for d in diffs) and calls['cudnn_fmha_forward'] > 0)  # NaN: not ok


CASES = {'global_lengths': (512, False, None), 'global_packed_mask': (512, True, None),
         'local_chunks': (1024, False, 64), 'local_chunks_packed': (1024, True, 64)}


def run_all(impl: str = 'cudnn') -> dict:
  """Every case, one failing case reported rather than raised (`impl='xla'`: a CPU smoke run
  of this script, no kernel)."""
  out = {}
  for name, args in CASES.items():
    try:
      out[name] = _case(*args, impl=impl)
    except Exception as e:  # pylint: disable=broad-exception-caught
      out[name] = {'error': f'{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}',
                   'ok': False}
    print(json.dumps({'cudnn_parity': name, **out[name]}), flush=True)
  return out


if __name__ == '__main__':
  import sys  # pylint: disable=g-import-not-at-top
  run_all(sys.argv[1] if len(sys.argv) > 1 else 'cudnn')
