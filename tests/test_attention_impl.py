"""`model.attention_impl`: the splash core (Pallas interpret mode on CPU) against the xla
cores, core by core and through a whole tiny model, heads sharded over a (1, 1, 2) mesh,
`auto` per platform, the xla fallback where splash cannot run (attention dropout), and a
deviceless TPU compile of a splash step (bert_jax/model/attention.py, splash.py)."""

import functools
import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.model import attention as attn
from bert_jax.model import encoder
from bert_jax.model import splash as splash_lib
from bert_jax.model.encoder import BertConfig, BertForPreTraining
from bert_jax.training import sharding as shd

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBTPU = os.path.join(ROOT, '.venv', 'libtpu')
# float32: <= 1e-5 (the bound). bfloat16: two bfloat16 ulps at [1, 2) (2 * 2^-7): both
# sides round q/sqrt(d), the probabilities and the outputs to bfloat16, in a different order;
# outputs and gradients here are O(1) (measured: one ulp, 7.8e-3, at most).
TOL = {jnp.float32: 1e-5, jnp.bfloat16: 1.6e-2}


def qkv(dtype, batch=2, length=128, heads=2, dim=64, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(k, (batch, length, heads, dim)).astype(dtype) for k in keys)


def unpacked_mask(batch, length, real):
  """[B, S] input mask: row b has real[b] real tokens, then padding."""
  return (jnp.arange(length)[None, :] < jnp.asarray(real)[:, None]).astype(jnp.int32)


def packed_ids(length):
  """Two packed rows: three instances and padding, and two instances filling the row."""
  a = np.zeros(length, np.int32)
  a[:40], a[40:77], a[77:110] = 1, 2, 3
  b = np.ones(length, np.int32)
  b[length // 2 + 3:] = 2
  return jnp.asarray(np.stack([a, b]))


def core(impl, q, k, v, input_mask=None, segs=None, half_window=None):
  batch, length = q.shape[:2]
  mask = attn.attention_mask(input_mask, segs, batch, length)
  groups = attn.token_groups(input_mask, segs, batch, length)
  if half_window is None:
    return attn.global_attention(q, k, v, mask, implementation=impl, groups=groups,
                                 packed=segs is not None)
  return attn.local_attention(q, k, v, mask, groups, half_window=half_window,
                              packed=segs is not None, implementation=impl)


def visible(input_mask, segs, length, half_window):
  """[B, S] True where a query has at least one allowed key: the positions whose outputs a
  loss can read. Packed padding (segment 0) and queries with no real key in their window are
  not (the module docstring of splash.py: each side gives a finite average there)."""
  i = jnp.arange(length)
  near = (jnp.ones((length, length), bool) if half_window is None
          else jnp.abs(i[:, None] - i[None, :]) <= half_window)
  if segs is not None:
    allowed = (segs[:, :, None] == segs[:, None, :]) & (segs[:, None, :] > 0)
  else:
    real = jnp.ones((1, length), bool) if input_mask is None else input_mask > 0
    allowed = jnp.broadcast_to(real[:, None, :], (real.shape[0], length, length))
  return (allowed & near[None]).any(-1)


def compare(dtype, input_mask=None, segs=None, half_window=None, length=128, wrap=None,
            batch=2):
  """Max abs differences (forward, grads of q, k, v) of splash against xla, over the
  positions a loss can read; asserts every splash output is finite."""
  q, k, v = qkv(dtype, batch=batch, length=length)
  weight = visible(input_mask, segs, length, half_window)[:, :, None, None]
  cot = jnp.sin(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape)) * weight

  def run(impl):
    f = lambda q, k, v: core(impl, q, k, v, input_mask, segs, half_window)
    g = lambda q, k, v: (f(q, k, v).astype(jnp.float32) * cot).sum()
    fn = jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(g, (0, 1, 2))(q, k, v)))
    if wrap is None:
      return fn(q, k, v)
    with wrap():
      return fn(q, k, v)

  out_x, grads_x = run('xla')
  out_s, grads_s = run('splash')
  assert out_s.dtype == dtype and bool(jnp.isfinite(out_s.astype(jnp.float32)).all())
  diff = lambda a, b, w: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)) * w))
  return (diff(out_s, out_x, weight),) + tuple(diff(a, b, 1.0) for a, b in zip(grads_s, grads_x))


CASES = {
    # BERT rows with padding, global; the second all padding (eval's filler rows): no key at
    # all, so its outputs are only checked to be finite
    'bert_padding': dict(input_mask=unpacked_mask(2, 128, [100, 0])),
    'packed_global': dict(segs=packed_ids(128)),
    # local layers: S = 2 * window (the xla side's dense band) and S = 4 * window (its chunks);
    # padded queries beyond half a window of the last real token have no allowed key
    'local_band_padding': dict(input_mask=unpacked_mask(2, 128, [70, 128]), half_window=32),
    'local_chunks_packed': dict(segs=packed_ids(256), half_window=32, length=256),
    'local_chunks_padding': dict(input_mask=unpacked_mask(2, 256, [150, 256]), half_window=64,
                                 length=256),
}


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16], ids=['f32', 'bf16'])
@pytest.mark.parametrize('case', list(CASES))
def test_splash_matches_xla_forward_and_gradients(case, dtype):
  diffs = compare(dtype, **CASES[case])
  print(f'{case} {jnp.dtype(dtype).name}: fwd {diffs[0]:.2e} dq {diffs[1]:.2e} '
        f'dk {diffs[2]:.2e} dv {diffs[3]:.2e}')
  assert max(diffs) <= TOL[dtype], diffs


def test_local_window_edge_is_two_sided_half_window():
  """A query sees the key half_window away on either side, and not one further."""
  q, k, v = qkv(jnp.float32, batch=1)
  h, i = 32, 60
  base = core('splash', q, k, v, half_window=h)[0, i]
  for j, seen in ((i + h, True), (i - h, True), (i + h + 1, False), (i - h - 1, False)):
    moved = core('splash', q, k, v.at[0, j].add(10.0), half_window=h)[0, i]
    assert bool(jnp.any(jnp.abs(moved - base) > 1e-3)) == seen, j


@pytest.mark.multi_device
def test_rows_and_heads_sharded_an_awkward_batch_padded():
  """Under a (data, fsdp, tensor) = (2, 1, 2) mesh and the default rules the kernel runs in a
  shard_map, one head per device, and still equals xla. 3 rows, which the data axis does not
  divide, go in as 4 (one empty), each device attending 2 rows of its own rather than all 3
  (splash.py, Sharding)."""
  mesh = shd.make_mesh((2, 1, 2), jax.devices()[:4])
  wrap = lambda: shd.activate(mesh, shd.DEFAULT_RULES)
  input_mask = unpacked_mask(3, 128, [100, 128, 50])
  q, k, v = qkv(jnp.float32, batch=3)
  with wrap():
    jaxpr = jax.make_jaxpr(lambda q, k, v: core('splash', q, k, v, input_mask))(q, k, v)
  maps = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == 'shard_map']
  assert len(maps) == 1
  shapes = [(x.aval.shape, str(spec)) for x, spec in zip(maps[0].invars,
                                                        maps[0].params['in_specs'])]
  assert ((4, 2, 128, 64), "P(('data', 'fsdp'), 'tensor', None, None)") in shapes, shapes
  for kwargs in (dict(input_mask=input_mask, batch=3),
                 dict(segs=packed_ids(256), half_window=32, length=256)):
    diffs = compare(jnp.float32, wrap=wrap, **kwargs)
    print('sharded', list(kwargs), diffs)
    assert max(diffs) <= 1e-5, diffs


@functools.lru_cache
def tiny_params(cfg: BertConfig):
  """`cfg`'s params from key 0, made once a module by one jitted init (an eager Flax init
  dispatches and compiles op by op: 3x the time; the values are the same)."""
  return jax.jit(encoder.init_params, static_argnums=0)(cfg, jax.random.key(0))


def model_loss(cfg, params, batch, deterministic=True, rng=None):
  out = BertForPreTraining(cfg).apply(
      {'params': params}, batch['input_ids'], batch.get('input_mask'),
      masked_lm_positions=batch['positions'], position_ids=batch.get('position_ids'),
      packed_segment_ids=batch.get('segs'), deterministic=deterministic,
      rngs=None if rng is None else {'dropout': rng})
  logp = jax.nn.log_softmax(out.mlm_logits)
  loss = -jnp.take_along_axis(logp, batch['labels'][..., None], -1).mean()
  if out.nsp_logits is not None:
    loss = loss + jax.nn.log_softmax(out.nsp_logits)[..., 0].mean()
  return loss


def tiny_batch(length, vocab, packed):
  rng = np.random.default_rng(0)
  batch = {'input_ids': jnp.asarray(rng.integers(5, vocab, (2, length)), jnp.int32),
           'positions': jnp.asarray([[1, 5, 30, 60], [2, 7, 40, 90]], jnp.int32),
           'labels': jnp.asarray(rng.integers(5, vocab, (2, 4)), jnp.int32)}
  if packed:
    segs = np.asarray(packed_ids(length))
    starts = np.stack([[np.argmax(row == x) for x in row] for row in segs])  # instance starts
    batch['segs'] = jnp.asarray(segs)
    batch['position_ids'] = jnp.asarray(np.where(segs > 0, np.arange(length) - starts, 0),
                                        jnp.int32)
  else:
    batch['input_mask'] = unpacked_mask(2, length, [100, length])
  return batch


@pytest.mark.parametrize('arch,packed,scan', [('bert', False, False), ('modern', True, True)])
def test_whole_tiny_model_loss_and_gradients_equal(arch, packed, scan):
  """BERT-tiny at one layer on padded rows, and a ModernBERT-tiny (global layer 0, local
  layer 1, window 64, scanned: a cond between the cores) on packed 256-token rows."""
  length = 256 if arch == 'modern' else 128
  extra = dict(local_window=64) if arch == 'modern' else dict(num_layers=1)
  cfg = BertConfig.from_preset('tiny', arch=arch, vocab_size=512, scan_layers=scan, **extra)
  params = tiny_params(cfg)
  batch = tiny_batch(length, 512, packed)
  results = {}
  for impl in ('xla', 'splash'):
    c = cfg.replace(attention_impl=impl)
    results[impl] = jax.jit(jax.value_and_grad(lambda p: model_loss(c, p, batch)))(params)
  (lx, gx), (ls, gs) = results['xla'], results['splash']
  gx, gs = jax.tree_util.tree_map(np.asarray, (gx, gs))  # compared in numpy: no eager ops
  grad_diff = max(float(np.max(np.abs(a - b))) for a, b in
                  zip(jax.tree_util.tree_leaves(gx), jax.tree_util.tree_leaves(gs)))
  print(f'{arch}: loss {float(lx):.6f} vs {float(ls):.6f}, grads max abs diff {grad_diff:.2e}')
  assert abs(float(lx) - float(ls)) <= 1e-5 and grad_diff <= 1e-5


def test_attention_dropout_in_training_falls_back_to_xla_and_says_so(caplog):
  """The kernel has no dropout: BERT training with attention dropout runs the xla core (the
  same numbers, same rng), said once in the log; eval (deterministic) runs splash."""
  attn._logged.clear()
  cfg = BertConfig.from_preset('tiny', vocab_size=512, scan_layers=False)
  params = tiny_params(cfg)
  batch = tiny_batch(128, 512, packed=False)
  rng = jax.random.key(1)
  with caplog.at_level(logging.WARNING):
    losses = [jax.jit(lambda p, b, r, c=cfg.replace(attention_impl=impl): model_loss(
        c, p, b, False, r))(params, batch, rng) for impl in ('xla', 'splash')]
  assert float(losses[0]) == float(losses[1])
  assert any('xla instead of splash for attention dropout' in r.getMessage()
             for r in caplog.records)


def test_auto_picks_per_platform_and_says_what_it_picked(monkeypatch, caplog):
  picked = {}
  for where in ('tpu', 'gpu', 'cpu'):
    attn._logged.clear()
    monkeypatch.setattr(attn, 'platform', lambda where=where: where)
    with caplog.at_level(logging.WARNING):
      picked[where] = attn.resolve('auto')
    assert f'model.attention_impl=auto on {where}: {picked[where]}' in caplog.text
  assert picked == {'tpu': 'splash', 'gpu': 'cudnn', 'cpu': 'xla'}
  monkeypatch.undo()
  assert attn.resolve('auto') == 'xla'  # this CPU test process
  assert attn.resolve(None) is None and attn.resolve('splash') == 'splash'
  with pytest.raises(ValueError, match='attention_impl'):
    BertConfig(attention_impl='flash')


def test_cudnn_rules_which_calls_run_the_kernel_how_it_is_fed_and_what_is_said(caplog):
  """attention.core / cudnn_feed (the module docstring's rules): float32, attention dropout
  and head sizes cuDNN lacks take xla, said once each; unpacked global rows go by key lengths
  (nothing said), packed rows and short local rows by a dense mask, long local rows by
  chunks, each said once."""
  attn._logged.clear()
  q = jnp.zeros((1, 128, 2, 64), jnp.bfloat16)
  with caplog.at_level(logging.INFO):
    assert attn.core('cudnn', q, dropout=False, packed=True) == 'cudnn'
    assert attn.core('cudnn', q.astype(jnp.float32), dropout=False, packed=False) == 'xla'
    assert attn.core('cudnn', q, dropout=True, packed=False) == 'xla'
    assert attn.core('cudnn', jnp.zeros((1, 128, 2, 100), jnp.bfloat16), dropout=False,
                     packed=False) == 'xla'
    assert attn.core('splash', q[:, :100], dropout=False, packed=False, groups=q) == 'xla'
    fallbacks = caplog.text
    caplog.clear()
    feeds = [attn.cudnn_feed(False, 8192), attn.cudnn_feed(True, 512),
             attn.cudnn_feed(False, 256, 64), attn.cudnn_feed(True, 255, 64),
             attn.cudnn_feed(True, 1024, 64), attn.cudnn_feed(True, 1024, 64)]
  assert feeds == ['lengths', 'mask', 'chunks', 'mask', 'chunks', 'chunks']
  for said in ('xla instead of cudnn for float32', 'xla instead of cudnn for attention dropout',
               'xla instead of cudnn for head size 100', 'multiple of 128'):
    assert said in fallbacks, said
  said = [r.getMessage() for r in caplog.records]
  assert said == ["model.attention_impl=cudnn: a dense mask for packed rows (jax's cuDNN call "
                  'takes no segment ids)',
                  "model.attention_impl=cudnn: sliding-window layers over rows of 256 tokens in "
                  "chunks of 64 (cuDNN's own window is one-sided)",
                  'model.attention_impl=cudnn: a dense mask for sliding-window layers over rows '
                  'of 255 tokens (under four chunks)',
                  "model.attention_impl=cudnn: sliding-window layers over rows of 1024 tokens "
                  "in chunks of 64 (cuDNN's own window is one-sided)"], said


def test_what_cudnn_is_given_computes_the_xla_cores():
  """The arguments the cudnn path hands jax.nn.dot_product_attention, run through jax's own
  xla implementation of the same call (cuDNN itself needs a GPU: benchmarks/gpu_attention.py
  checks it there): key lengths of padded rows equal the xla core's mask (a filler row of
  padding alone attends its first key), and the [B*n, c, 3c] chunks of a packed, padded
  local layer equal the chunked core."""
  q, k, v = qkv(jnp.float32, batch=3, length=256)
  input_mask = unpacked_mask(3, 256, [100, 256, 0])
  mask = attn.attention_mask(input_mask, None, 3, 256)
  segs = crossing_segments(256)
  readable = (segs > 0)[..., None, None]  # packed padding: no loss reads it

  def chunked(fused, q, k, v):  # forward: gradients are autodiff's of the same ops
    return attn._chunked_local_attention(q, k, v, segs, 32, True, 0.0, None, fused) * readable

  @jax.jit
  def both(q, k, v):  # one compile for every side
    return (attn.fused_by_lengths(q, k, v, input_mask, fused='xla'),
            attn.global_attention(q, k, v, mask, implementation='xla'),
            chunked(None, q[:2], k[:2], v[:2]), chunked('xla', q[:2], k[:2], v[:2]))

  by_lengths, dense, ours, given = both(q, k, v)
  assert float(jnp.max(jnp.abs(by_lengths - dense)[:2])) <= 1e-5
  assert float(jnp.max(jnp.abs(by_lengths[2] - v[2, :1]))) <= 1e-6
  assert float(jnp.max(jnp.abs(ours - given))) <= 1e-5


def test_a_query_that_reads_no_key_gets_a_zero_output_and_zero_gradients_from_the_fused_call():
  """cuDNN's backward gives a query with every key masked a NaN dq (measured on an H200 for
  padded local chunks; benchmarks/cudnn_parity.py), which the query projection's gradient
  sums into every weight. The masked fused call (`fused_by_mask`, jax's xla implementation of
  the same call here) reads key 0 for such a query and zeroes its output, so nothing flows
  back from it; the other queries equal the xla core."""
  q, k, v = qkv(jnp.float32, batch=2, length=64)
  mask = attn.attention_mask(unpacked_mask(2, 64, [40, 0]), None, 2, 64)
  mask = jnp.broadcast_to(mask, (2, 1, 64, 64)) & attn.band(64, 8)
  mask = mask & (jnp.arange(64) < 40)[None, None, :, None]  # queries past 40 read nothing
  readable = mask.any(-1)[:, 0, :, None, None]
  cot = jnp.cos(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape))

  @jax.jit
  def both(q, k, v):
    fused = lambda q, k, v: attn.fused_by_mask(q, k, v, mask, fused='xla')
    core = lambda q, k, v: attn.global_attention(q, k, v, mask, implementation='xla')
    return [(f(q, k, v), jax.grad(lambda *a: (f(*a) * cot * readable).sum(), (0, 1, 2))(q, k, v),
             jax.grad(lambda *a: (f(*a) * cot).sum())(q, k, v)) for f in (fused, core)]

  (out, grads, dq_all), (ref, ref_grads, _) = both(q, k, v)
  assert int(readable.sum()) == 40 and bool(jnp.all(jnp.where(readable, True, out == 0)))
  assert float(jnp.max(jnp.abs((out - ref) * readable))) <= 1e-5
  for a, b in zip(grads, ref_grads):
    assert float(jnp.max(jnp.abs(a - b))) <= 1e-5
  assert bool(jnp.all(jnp.where(readable, True, dq_all == 0)))  # even with a cotangent there


def aot(*args, libtpu=True, dump=None) -> subprocess.Popen:
  """`python -m bert_jax.aot ARGS` started as tests/test_aot.py runs it (several may compile
  at once); `dump`: XLA's HLO dumps of the train step there (the other modules' dumps,
  init's and the rest, are not read)."""
  paths = [LIBTPU, ROOT] if libtpu else [ROOT]
  if libtpu and not os.path.isdir(os.path.join(LIBTPU, 'libtpu')):
    pytest.fail(f'{LIBTPU}: no libtpu; run bash scripts/setup_env.sh (requirements-aot.txt)')
  xla_flags = (f'--xla_dump_to={dump} --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_step'
               if dump else '')
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths), XLA_FLAGS=xla_flags,
             TPU_WORKER_HOSTNAMES='localhost', TPU_ACCELERATOR_TYPE='v4-8',
             ALLOW_MULTIPLE_LIBTPU_LOAD='1')
  return subprocess.Popen([sys.executable, '-m', 'bert_jax.aot', *args], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


SPLASH_STEPS = {  # BERT-tiny with splash asked for (and the dropout it cannot do turned off),
    # 2 rows a chip (at 1 the compiled TFLOPs round to 0.000) and the chunked MLM loss;
    # ModernBERT-tiny as configured (auto, which is
    # splash on TPU: global and local layers) at 1 row a chip of 256 tokens: two 128-token
    # blocks, so the local layer's window crosses a block edge (a libtpu compile here grows
    # with the rows: ModernBERT-tiny's 4 rows a chip of 1,024 tokens cost ~4x as much)
    'bert': ('configs/bert_tiny.py', '--config.model.attention_impl=splash',
             '--config.model.attention_dropout=0', '--rows_per_chip=2',
             '--config.model.mlm_loss_chunk=8', '--config.model.num_layers=1'),
    # (BERT at one layer, ModernBERT-tiny's two: one global, one local; a TPU compile costs
    # ~8 s a layer here)
    'modern': ('configs/modern.py:tiny,phase1', '--rows_per_chip=1',
               '--config.data.max_seq_length=256', '--config.data.max_predictions_per_seq=77'),
}


def test_splash_steps_compile_for_v5e_and_report_their_memory(tmp_path):
  """`python -m bert_jax.aot --topology=v5e:2x2` on splash steps: they compile, fit, hold the
  splash kernels (Mosaic custom calls: forward, dq, dkv) and report their cost per chip."""
  runs = {name: aot(f'--config={config}', '--topology=v5e:2x2', *flags,
                    dump=tmp_path / name)
          for name, (config, *flags) in SPLASH_STEPS.items()}
  for name, proc in runs.items():
    stdout, stderr = proc.communicate(timeout=400)
    assert proc.returncode == 0, stderr[-3000:]
    result = json.loads(stdout[stdout.index('{'):])
    print(name, result)
    assert result['chips'] == 4 and result['device_kind'].startswith('TPU v5')
    assert result['fits'] and 0 < result['per_chip_gib'] < 1, result
    # (init's 8-token dummy rows fall back, said at INFO level; the step's rows do not)
    assert 'xla instead of splash for attention dropout' not in stderr
    assert f"rows of {result['seq_len']} tokens" not in stderr
    if name == 'modern':
      assert 'model.attention_impl=auto on tpu: splash' in stderr
    else:  # what fits a chip: rows asked for, the compiled cost and a roofline estimate
      assert result['global_batch'] == 8 and result['mlm_loss_chunk'] == 8
      assert result['compiled_tflops'] > 0 and result['compiled_gb_accessed'] > 0
      assert result['roofline_ms_estimate'] > 0
    dumps = [p for p in (tmp_path / name).iterdir() if 'jit_step' in p.name
             and p.name.endswith('after_optimizations.txt')]
    kernels = sum(p.read_text().count('custom_call_target="tpu_custom_call"') for p in dumps)
    assert kernels >= 3, (name, kernels)


def test_aot_without_libtpu_says_how_to_get_it():
  proc = aot('--config=configs/bert_tiny.py', '--topology=v5e:2x2', libtpu=False)
  _, stderr = proc.communicate(timeout=300)
  assert proc.returncode != 0 and "pip install 'jax[tpu]'" in stderr, stderr[-2000:]


# ------------------------------------------------------------- splash across blocks (issue 36)
# Rows of 3 and 5 blocks of 128 tokens (splash.block_size picks 128 for 384 and 640), where the
# kernel's online softmax runs over several key blocks and the local mask skips whole blocks.


def reference(q, k, v, allowed):
  """Plain softmax attention in float32 at full matmul precision over `allowed` [B, S, S]; a
  query with no allowed key gets the uniform average of the row's values (every logit masked
  to the same value), as both of our cores give."""
  f32 = lambda x: x.astype(jnp.float32)
  hi = jax.lax.Precision.HIGHEST
  logits = jnp.einsum('bqhd,bkhd->bhqk', f32(q), f32(k), precision=hi) / np.sqrt(q.shape[-1])
  logits = jnp.where(allowed[:, None], logits, jnp.finfo(jnp.float32).min)
  return jnp.einsum('bhqk,bkhd->bqhd', jax.nn.softmax(logits, -1), f32(v), precision=hi)


def allowed_pairs(groups, packed, half_window=None):
  """[B, S, S] from the token groups by the rule attention.py's docstring states: keys of real
  tokens (of the query's own instance when packed) within the window."""
  ok = (groups[:, None, :] > 0) & (groups[:, :, None] == groups[:, None, :] if packed else True)
  if half_window is not None:
    ok = ok & attn.band(groups.shape[1], half_window)[None]
  return ok


def crossing_segments(length):
  """Two packed rows whose instances cross the 128-token block edges: [0, 100), [100, 300),
  [300, 370) then padding; [0, 200), [200, length)."""
  a = np.zeros(length, np.int32)
  a[:100], a[100:300], a[300:370] = 1, 2, 3
  b = np.where(np.arange(length) < 200, 1, 2).astype(np.int32)
  return jnp.asarray(np.stack([a, b]))


BLOCK_CASES = {
    # global, 5 blocks, bfloat16: padding ends inside block 2; the second row has no real key
    'global_padding_mid_block_no_key_bf16': dict(length=640, dtype=jnp.bfloat16, packed=False,
                                                 groups=unpacked_mask(2, 640, [333, 0])),
    # float32, a two-sided window of 64: each query block meets its neighbours' blocks in part
    # and skips the rest; packed instances cross block edges and the row ends in padding
    'local_packed_crossing_blocks': dict(length=640, dtype=jnp.float32, packed=True,
                                         groups=crossing_segments(640), half_window=64),
}


@pytest.mark.parametrize('case', list(BLOCK_CASES))
def test_splash_across_blocks_matches_softmax_and_xla(case):
  """Forward and q/k/v gradients of splash against the plain reference and the xla core.
  Compared where a loss can read (`visible`): every query of an unpacked global row, the
  no-key row included, whose output is the mean of its values; gradients flow from those
  positions only (the kernel's backward through a no-key query is not the reference's: no
  loss reads one)."""
  c = BLOCK_CASES[case]
  length, dtype, packed, groups = c['length'], c['dtype'], c['packed'], c['groups']
  half_window = c.get('half_window')
  assert splash_lib.block_size(length) == 128 and length // 128 >= 3
  q, k, v = qkv(dtype, length=length, heads=1)
  allowed = allowed_pairs(groups, packed, half_window)
  has_key = allowed.any(-1)
  seen = has_key | (not packed and half_window is None)  # unpacked global: every query
  cot = jnp.sin(jnp.arange(q.size, dtype=jnp.float32).reshape(q.shape)) * has_key[..., None, None]
  mask = attn.attention_mask(*((None, groups) if packed else (groups, None)), 2, length)

  def with_grads(f):
    loss = lambda q, k, v: (f(q, k, v).astype(jnp.float32) * cot).sum()
    return jax.jit(lambda q, k, v: (f(q, k, v), jax.grad(loss, (0, 1, 2))(q, k, v)))(q, k, v)

  sides = {
      'splash': lambda q, k, v: splash_lib.splash_attention(
          q, k, v, groups, packed=packed, half_window=half_window, interpret=True),
      'xla': lambda q, k, v: (
          attn.global_attention(q, k, v, mask, implementation='xla', groups=groups,
                                packed=packed) if half_window is None else
          attn.local_attention(q, k, v, mask, groups, half_window=half_window, packed=packed,
                               implementation='xla')),
      'reference': lambda q, k, v: reference(q, k, v, allowed)}
  out = {name: with_grads(f) for name, f in sides.items()}
  f32 = lambda x: x.astype(jnp.float32)
  splash_out = f32(out['splash'][0])
  assert bool(jnp.isfinite(splash_out).all())
  if not has_key.all() and not packed and half_window is None:  # the no-key row: mean of v
    row = int(jnp.argmin(has_key.any(-1)))
    assert float(jnp.max(jnp.abs(splash_out[row] - f32(v[row]).mean(0)))) <= TOL[dtype]
  for other in ('reference', 'xla'):
    fwd = float(jnp.max(jnp.abs(splash_out - f32(out[other][0])) * seen[..., None, None]))
    grads = [float(jnp.max(jnp.abs(f32(a) - f32(b))))
             for a, b in zip(out['splash'][1], out[other][1])]
    print(f'{case}: splash vs {other}: fwd {fwd:.2e} dq {grads[0]:.2e} dk {grads[1]:.2e} '
          f'dv {grads[2]:.2e}')
    assert max([fwd] + grads) <= TOL[dtype], (other, fwd, grads)
