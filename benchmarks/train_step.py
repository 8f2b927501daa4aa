r"""One training step of a configured pre-training run (forward, backward, optimizer) on this
machine.

  .venv/bin/python benchmarks/train_step.py [--sizes=tiny,mini,small,base] [--dtype=float32]
      [--unrolled] [--vocab_size=30522] [--steps=10] [--warmup=3]
  .venv/bin/python benchmarks/train_step.py --config=configs/bert_tiny.py [--batch=32]
  .venv/bin/python benchmarks/train_step.py --sizes=tiny --steps=3 --warmup=1   # smoke

Per model: compile seconds, the median (min-max) step time of `--steps` steps after
`--warmup`, tokens/s (rows x length / step time) and MFU against a float32 (or bf16) matmul
peak measured in the same process. `--sizes` times configs/benchmarks.py's recipe of each size
(configs/common.py's run: adamw_bert, the default rules, scanned layers, vocab 30,522, 128
tokens, 20 predictions; batch 32, 8 for base); `--config` times a config file's own run
(its optimizer, dtype, layers and vocab). `--batch`, `--seq`, `--dtype`, `--unrolled` and
`--vocab_size` override the config's fields, as --config.X does on the command line. The step
is the run setup's (benchmarks/harness.py), on random batches (~10% padding) already on the
device.
"""

import argparse

import harness

if __name__ == '__main__':
  harness.tuned_malloc()

import jax  # noqa: E402

from bert_jax.model import flops  # noqa: E402


def bench(config, steps: int = 10, warmup: int = 3) -> dict:
  """Times the train step of `config` (a harness.config); its figures as a dict."""
  setup = harness.configured_setup(config, devices=jax.devices()[:1])
  rows, seq, preds = harness.batch_geometry(setup)
  run = harness.time_train_steps(setup, harness.synthetic_batches(setup), steps=steps,
                                 warmup=warmup)
  step_s = run.timing.median
  dtype = setup.model_cfg.dtype
  peak = flops.measured_matmul_peak(dtype=dtype)
  model_flops = setup.objective.train_flops(rows, seq, preds)  # RTD's counts its generator
  return dict(size=setup.config.model.size, batch=rows, seq=seq, dtype=dtype,
              optimizer=setup.config.optimizer.name, scan=setup.model_cfg.scan_layers,
              vocab=setup.model_cfg.vocab_size, compile_s=run.compile_s, step_s=step_s,
              step_lo_s=run.timing.lo, step_hi_s=run.timing.hi,
              tokens_per_s=rows * seq / step_s, mfu=model_flops / step_s / peak,
              peak_gflops=peak / 1e9)


def overrides(dtype=None, scan=None, vocab_size=None, batch=None, seq=None) -> dict:
  """The config fields behind the flags (None: the config's own)."""
  fields = {'model.dtype': dtype, 'model.scan_layers': scan, 'model.vocab_size': vocab_size,
            'train.global_batch_size': batch, 'data.max_seq_length': seq}
  return {k: v for k, v in fields.items() if v is not None}


def main():
  p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  p.add_argument('--sizes', default='tiny,mini,small,base')
  p.add_argument('--config', default='', help='a config file (configs/bert_tiny.py[:phase]) '
                 'instead of --sizes')
  p.add_argument('--dtype', default=None, help='model.dtype (default: the config\'s, float32)')
  p.add_argument('--unrolled', action='store_true', help='model.scan_layers=False')
  p.add_argument('--vocab_size', type=int, default=None, help='model.vocab_size; 8192: the '
                 'CPU demo\'s')
  p.add_argument('--batch', type=int, default=None, help='train.global_batch_size')
  p.add_argument('--seq', type=int, default=None, help='data.max_seq_length')
  p.add_argument('--steps', type=int, default=10)
  p.add_argument('--warmup', type=int, default=3)
  args = p.parse_args()
  fields = overrides(args.dtype, False if args.unrolled else None, args.vocab_size, args.batch,
                     args.seq)
  configs = ([harness.config(args.config, **fields)] if args.config else
             [harness.config('benchmarks', size, **fields) for size in args.sizes.split(',')])
  print(f'{harness.machine()}\njax {jax.__version__} on {jax.devices()[0].device_kind}; '
        f'median (min-max) of {args.steps} steps after {args.warmup}')
  print(f'{"size":6} {"batch":>5} {"seq":>4} {"dtype":>8} {"scan":>5} {"optimizer":>10} '
        f'{"compile s":>9} {"step ms":>24} {"tokens/s":>9} {"MFU":>6}')
  for config in configs:
    r = bench(config, args.steps, args.warmup)
    step = f'{1e3 * r["step_s"]:.1f} ({1e3 * r["step_lo_s"]:.1f}-{1e3 * r["step_hi_s"]:.1f})'
    print(f'{r["size"]:6} {r["batch"]:5d} {r["seq"]:4d} {r["dtype"]:>8} {str(r["scan"]):>5} '
          f'{r["optimizer"]:>10} {r["compile_s"]:9.1f} {step:>24} {r["tokens_per_s"]:9.0f} '
          f'{r["mfu"]:6.1%}   (vocab {r["vocab"]}, peak {r["peak_gflops"]:.0f} GFLOP/s)',
          flush=True)


if __name__ == '__main__':
  main()
