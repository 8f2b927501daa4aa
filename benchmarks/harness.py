r"""What every speed script shares: the configured run's step, one way to time things, rounds
that alternate contenders, one subprocess runner, and the machine line printed with a figure.

A benchmark times what a user's run executes. `configured_setup` builds a config's run setup
through the product's own path (`bert_jax.pretrain.step.setup`: the config's optimizer,
schedule, sharding rules, dtype and batch layout); a script changes what it times through
config fields (size, batch, sequence length, dtype, scan), as a user does with --config.X,
never by assembling a step from the model and optimizer modules.

  import harness  # benchmarks/ is on sys.path when a script runs as python benchmarks/x.py
  setup = harness.configured_setup('bert_tiny', **{'train.global_batch_size': 32})
  result = harness.time_train_steps(setup, harness.synthetic_batches(setup), steps=10)
  print(harness.machine(), result.timing.show(1e3, ' ms'))

  python benchmarks/harness.py   # the machine line alone (benchmarks/length_buckets.sh)

The data scripts report the peak memory of the processes they start, and a child's peak
resident size starts at its parent's (fork copies it, exec keeps the high-water mark), so this
module imports jax, numpy and the model only inside the functions that use them.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from bert_jax.training import host_malloc  # standard library only; installed: pyproject.toml


def module_from_file(name: str, path: str):
  """The module in file `path`, outside the installed packages (the tests' fake GCS server, a
  reference checkout's tokenization.py), imported as `name` without putting its directory on
  sys.path, where its neighbours would shadow installed modules for the rest of the script."""
  spec = importlib.util.spec_from_file_location(name, path)
  if spec is None or not os.path.isfile(path):
    raise FileNotFoundError(f'{path}: no such Python file to import as {name}')
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  spec.loader.exec_module(module)
  return module


def tuned_malloc() -> None:
  """Re-executes this script with the CPU allocator settings the CLIs use (a step without them
  page-faults its working set afresh: bert_jax/training/host_malloc.py). Call it first thing
  under `if __name__ == '__main__'`."""
  host_malloc.reexec_with_tuned_malloc()


# ----------------------------------------------------------------------------- configured runs


def config(name, phase: str = 'phase1', **overrides):
  """A config as the CLI loads `--config=configs/NAME.py:PHASE`, with dotted `overrides`
  (`**{'train.global_batch_size': 32}`) set as `--config.train.global_batch_size=32` would.

  `name`: a ConfigDict (copied), a configs module, or 'bert_tiny', 'bert_tiny:phase1' or
  'configs/bert_tiny.py[:phase1]' (a phase in the name wins over `phase`)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  from configs import common  # pylint: disable=g-import-not-at-top
  if isinstance(name, ml_collections.ConfigDict):
    c = copy.deepcopy(name)
  else:
    module = name
    if isinstance(name, str):
      path, _, arg = name.partition(':')
      phase = arg or phase
      module = importlib.import_module(
          'configs.' + os.path.splitext(os.path.basename(path))[0])
    c = module.get_config(phase)
  return common.override(c, overrides)


def configured_setup(name, phase: str = 'phase1', devices=None, **overrides):
  """The pre-training run setup (bert_jax/training/run_setup.py `RunSetup`) of `config(name,
  phase, **overrides)` over `devices` (default all, as a run)."""
  from bert_jax.pretrain import step  # pylint: disable=g-import-not-at-top
  return step.setup(config(name, phase, **overrides), devices)


def batch_geometry(setup) -> tuple[int, int, int]:
  """(rows, tokens per row, predictions per row) of one step of the setup's run."""
  return (setup.config.train.global_batch_size, setup.layout.max_seq_length,
          setup.layout.max_predictions_per_seq)


def synthetic_batches(setup, n: int = 2, *, seed: int = 0, pad_fraction: float = 0.1,
                      on_device: bool = True) -> list:
  """`n` random global batches in the run's layout (bert_jax/pretrain/synthetic.py: ~10%
  padding, real MLM labels, packed fields when the config packs), sharded as a run's are;
  numpy (`on_device=False`) for a peer that takes the same data."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.pretrain import synthetic  # pylint: disable=g-import-not-at-top
  from bert_jax.training import sharding  # pylint: disable=g-import-not-at-top
  rows, seq, preds = batch_geometry(setup)
  layout, rng = setup.layout, np.random.default_rng(seed)
  host = [synthetic.random_batch(rng, rows, seq, preds, setup.model_cfg.vocab_size,
                                 pad_fraction, layout.packed, layout.max_instances_per_row)
          for _ in range(n)]
  return [sharding.global_batch(b, setup.mesh) for b in host] if on_device else host


def reader(config_dict, files: str, *, seed: int = 0):
  """The run's own reader of `files` for this config, in training mode: an iterator of host
  batches (`input_pipeline.pretrain.dataset.reader_config`: the config's layout, masking,
  packing, threads). TensorFlow loads here, not before (4 s, and memory a data script's
  children would inherit)."""
  from input_pipeline.pretrain import dataset  # pylint: disable=g-import-not-at-top
  cfg = dataset.reader_config(config_dict, files, config_dict.train.global_batch_size, seed)
  return dataset.DataIterator(dataset.make_dataset(cfg, training=True), files)


def compile_train_step(setup, batch=None) -> tuple[Callable, float]:
  """(the setup's train step compiled ahead of time for its state and `batch` (default the
  run's abstract batch), compile seconds). Nothing is allocated: the state is abstract."""
  step = setup.train_step()
  start = time.perf_counter()
  with step.activate():
    compiled = step.jitted.lower(setup.abstract_state(),
                                 setup.abstract_batch() if batch is None else batch).compile()
  return compiled, time.perf_counter() - start


# ----------------------------------------------------------------------------- timing


@dataclasses.dataclass(frozen=True)
class Spread:
  """Repeated measurements: their median and range."""
  values: tuple[float, ...]

  @property
  def median(self) -> float:
    return statistics.median(self.values)

  @property
  def lo(self) -> float:
    return min(self.values)

  @property
  def hi(self) -> float:
    return max(self.values)

  def show(self, scale: float = 1.0, unit: str = '', digits: int = 1) -> str:
    """'123.4 ms (120.1-130.2)' for `show(1e3, ' ms')` of seconds."""
    f = lambda x: f'{x * scale:,.{digits}f}'  # noqa: E731
    return f'{f(self.median)}{unit} ({f(self.lo)}-{f(self.hi)})'


@dataclasses.dataclass(frozen=True)
class Timing(Spread):
  """Seconds per timed call (warm-up excluded) and what each timed call returned."""
  results: tuple = ()


def timed(fn: Callable[[int], Any], *, steps: int = 10, warmup: int = 3,
          seconds: float | None = None, sync: Callable[[Any], Any] | None = None,
          back_to_back: bool = False) -> Timing:
  """Calls `fn(i)` for `warmup` untimed calls, then times `steps` calls (or as many as
  `seconds` allow), each waited for with `sync(result)` (default `jax.block_until_ready`;
  `lambda r: r` where the result is already on the host).

  `back_to_back`: the timed calls are dispatched without waiting and synced once at the end
  (an accelerator's steady state, where the host runs ahead): one value, total / steps."""
  if sync is None:
    import jax  # pylint: disable=g-import-not-at-top
    sync = jax.block_until_ready
  for i in range(warmup):
    sync(fn(i))
  if back_to_back:
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
      result = fn(i)
    sync(result)
    return Timing(((time.perf_counter() - start) / steps,), (result,))
  values, results, i, begin = [], [], warmup, time.perf_counter()
  while (len(values) < steps if seconds is None else time.perf_counter() - begin < seconds):
    start = time.perf_counter()
    result = sync(fn(i))
    values.append(time.perf_counter() - start)
    results.append(result)
    i += 1
  return Timing(tuple(values), tuple(results))


@dataclasses.dataclass
class StepRun:
  """A timed run of a setup's train step: per-step seconds, compile seconds, and the compiled
  step with the state and metrics it left (to go on stepping, as gpu_step.py does)."""
  timing: Timing
  compile_s: float
  step: Callable
  state: Any
  metrics: Any


def time_train_steps(setup, batches: Sequence, *, steps: int = 10, warmup: int = 3,
                     back_to_back: bool = False, state=None) -> StepRun:
  """The setup's train step, compiled, then `timed` on `batches` in turn from a fresh state
  (or `state`): what one step of the configured run costs, input already on the devices."""
  compiled, compile_s = compile_train_step(setup, batches[0])
  holder = {'state': setup.fresh_state() if state is None else state}

  def one(i):
    holder['state'], metrics = compiled(holder['state'], batches[i % len(batches)])
    return metrics

  timing = timed(one, steps=steps, warmup=warmup, back_to_back=back_to_back)
  return StepRun(timing, compile_s, compiled, holder['state'], timing.results[-1])


def interleave(contenders: dict[str, Callable[[], Any]], rounds: int,
               report: Callable[[int, str, Any], None] | None = None) -> dict[str, list]:
  """Runs every contender once per round, in order, for `rounds` rounds: a change in the
  shared machine's load hits all of them, so ratios within a run are fair. Returns each
  contender's results by round; `report(round, name, result)` sees each as it comes."""
  out = {name: [] for name in contenders}
  for r in range(rounds):
    for name, fn in contenders.items():
      out[name].append(fn())
      if report:
        report(r, name, out[name][-1])
  return out


def ratios(numerators: Sequence[float], denominators: Sequence[float]) -> Spread:
  """Round-by-round ratios of two interleaved contenders' figures."""
  return Spread(tuple(a / b for a, b in zip(numerators, denominators)))


# ----------------------------------------------------------------------------- processes


@dataclasses.dataclass(frozen=True)
class Ran:
  """A finished command: its output, wall seconds and peak resident size (MiB, the largest of
  the process and the descendants it waited for)."""
  stdout: str
  stderr: str
  seconds: float
  peak_rss_mib: float

  def last_json(self) -> dict:
    """The last stdout line that is a JSON object (a worker's result)."""
    lines = [l for l in self.stdout.splitlines() if l.startswith('{')]
    if not lines:
      raise RuntimeError(f'no JSON line in the output:\n{self.stdout[-2000:]}')
    return json.loads(lines[-1])


def run(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: str | None = None,
        timeout: float | None = None, echo: bool = False, tail: int = 3000) -> Ran:
  """Runs `cmd` to completion with `env` added to this process's environment, capturing
  stdout and stderr (and echoing them as they come with `echo`). A non-zero exit or the
  `timeout` raises RuntimeError naming the command, with the last `tail` characters of its
  stderr (or stdout when stderr is empty)."""
  cmd = [str(c) for c in cmd]
  start = time.perf_counter()
  try:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=cwd,
                            env={**os.environ, **(env or {})})
  except OSError as e:
    raise RuntimeError(f'cannot run {cmd[0]!r}: {e.strerror}; install it or give its '
                       'path') from e
  chunks = {'out': [], 'err': []}

  def drain(pipe, key, mirror):
    for line in iter(pipe.readline, b''):
      chunks[key].append(line)
      if echo:
        mirror.write(line.decode(errors='replace'))
        mirror.flush()

  readers = [threading.Thread(target=drain, args=(proc.stdout, 'out', sys.stdout)),
             threading.Thread(target=drain, args=(proc.stderr, 'err', sys.stderr))]
  timed_out = threading.Event()

  def kill():
    timed_out.set()
    proc.kill()

  killer = threading.Timer(timeout, kill) if timeout else None
  for t in readers + ([killer] if killer else []):
    t.start()
  _, status, usage = os.wait4(proc.pid, 0)  # rusage: the peak RSS subprocess.run drops
  proc.returncode = os.waitstatus_to_exitcode(status)
  seconds = time.perf_counter() - start
  if killer:
    killer.cancel()
  for t in readers:
    t.join()
  out, err = (b''.join(chunks[k]).decode(errors='replace') for k in ('out', 'err'))
  if proc.returncode:
    why = (f'ran past its {timeout:g} s timeout' if timed_out.is_set()
           else f'exited with {proc.returncode}')
    raise RuntimeError(f'{" ".join(cmd)} {why}:\n{(err or out)[-tail:] or "(no output)"}')
  return Ran(out, err, seconds, usage.ru_maxrss / 1024)


# ----------------------------------------------------------------------------- the machine


def machine() -> str:
  """The CPU a figure was taken on: lscpu's model name, the core count, the avx flags, and the
  load average at the time (the VM is shared; its speed moves with the neighbours')."""
  model, flags = 'unknown CPU', []
  try:
    lscpu = run(['lscpu']).stdout
  except RuntimeError:  # not Linux, or util-linux missing
    lscpu = ''
  for line in lscpu.splitlines():
    key, _, value = line.partition(':')
    if key.strip() == 'Model name':
      model = value.strip()
    elif key.strip() == 'Flags':
      flags = sorted(f for f in value.split() if f.startswith('avx'))
  load = ' '.join(f'{x:.2f}' for x in os.getloadavg())
  return (f'{model}, {os.cpu_count()} cores, {" ".join(flags) or "no avx flags"}; '
          f'load average {load}')


if __name__ == '__main__':
  print(machine())


# ----------------------------------------------------------------------------- the demo's recipes


def demo_mr(init: str, workdir: str, seeds: int, recipe: str = 'mr', **overrides) -> dict:
  """MR test accuracy {median, min, max, values, majority} of configs/demo.py's `recipe` from
  `init`, as the demo fine-tunes (a complete earlier run in `workdir` is reused)."""
  from bert_jax.finetune import results, run as finetune  # pylint: disable=g-import-not-at-top
  from configs import common, demo as recipes  # pylint: disable=g-import-not-at-top
  config = common.override(recipes.RECIPES[recipe](init, seeds), overrides)
  return results.split_headline(finetune.run_or_reuse(config, workdir), 'test')


def compare_arms(arm: dict, baseline: dict, what: str) -> dict:
  """Two arms' seed results ({median, min, max}): the gap of the medians, and whether their
  seed ranges are apart ('<what> pays' / 'costs, beyond the seed spread', else 'within')."""
  if arm['min'] > baseline['max']:
    verdict = f'{what} pays, beyond the seed spread'
  elif arm['max'] < baseline['min']:
    verdict = f'{what} costs, beyond the seed spread'
  else:
    verdict = 'within the seed spread'
  return {'gap': arm['median'] - baseline['median'],
          'beyond_spread': arm['min'] > baseline['max'] or arm['max'] < baseline['min'],
          'margin': arm['min'] - baseline['max'], 'verdict': verdict}
