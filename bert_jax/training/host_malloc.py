r"""glibc malloc settings that let XLA's CPU runtime reuse its buffers from step to step.

XLA on CPU mallocs every step's activations, gradients and temporaries and frees them at the
end of the step. With glibc's defaults those pages go back to the kernel (buffers over 32 MiB
are mmap'ed and unmapped each time; the per-thread arenas trim what is freed), so every step
page-faults its whole working set afresh: ~450,000 faults per step of a MiniLM-sized fine-tune
(batch 32 x 64) on 2 cores, a quarter of its time. One arena, no mmap and no trimming keep the
memory mapped: the step drops from ~860 to ~630 ms and the faults by 10x
(benchmarks/RESULTS.md, "The CPU allocator"). TensorFlow's TPU VM images preload tcmalloc for
the same reason; this needs no extra library.

The cost is memory. XLA plans each program's temporaries as one block (~1.3 GB for a MiniLM
embedding step of 128 rows x 32 tokens). A bare loop of steps usually reuses it, not always:
small allocations made between steps are carved out of the freed block, the next block no
longer fits its hole and the heap grows by one (the embedding recipe's 128-token step, a 7.3
GiB block, held two); a fine-tuning command's first steps leave several behind in the one arena
before it settles (8.5 GiB peak against 2.8 GiB with glibc's defaults; steps 1.25-1.8x slower
there; benchmarks/RESULTS.md, "The CPU allocator", `python benchmarks/allocator.py`, which also
measures glibc's defaults on transparent huge pages, `glibc.malloc.hugetlb=1`: as fast here,
with their memory). Later seeds add nothing.
A run that compiles several programs with multi-GB blocks (the embedding recipe's 64 pairs of
128-token texts in four length buckets: 7.3 GiB at 128 tokens) would keep leaving such blocks behind
until the machine ran out (24 GB at step 4); so the loop calls `trim_if_over` after every step:
once the process holds more than `RESIDENT_SHARE` of the machine's memory, `malloc_trim(0)`
gives every free page of the arena back (as glibc's defaults would have, all along), and the
blocks are kept again from there. Where memory matters more than speed, set GLIBC_TUNABLES=
(empty) before the command.

GLIBC_TUNABLES is read once, when a process starts, so the CPU entry points (`bert_jax.main`,
`bert_jax.finetune.run`, `bert_jax.demo`) re-execute themselves with it set, before their heavy
imports. Nothing happens where the variable is already set (set it, even to an empty string,
to keep your own), on a C library other than glibc, or where a GPU or TPU is attached (device
memory is not malloc'ed, and the host's input threads keep their per-thread arenas).

  python -m bert_jax.training.host_malloc COMMAND [ARGS...]   # runs COMMAND with the settings
"""

from __future__ import annotations

import ctypes
import functools
import glob
import logging
import os
import platform
import resource
import sys

TUNABLES = ('glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:'
            'glibc.malloc.arena_max=1')
ACCELERATOR_DEVICES = ('/dev/nvidia[0-9]*', '/dev/accel[0-9]*', '/dev/vfio/[0-9]*')
# The share of the machine's memory a tuned process may keep resident before `trim_if_over`
# returns its arena's free pages: below it, kept blocks are the speed; above, a risk of the
# next step's block not fitting.
RESIDENT_SHARE = 0.4


def accelerator_attached() -> bool:
  return any(glob.glob(pattern) for pattern in ACCELERATOR_DEVICES)


def wanted(environ=None) -> bool:
  environ = os.environ if environ is None else environ
  return ('GLIBC_TUNABLES' not in environ and platform.libc_ver()[0] == 'glibc'
          and not accelerator_attached())


def tuned_environ(environ=None) -> dict[str, str]:
  environ = dict(os.environ if environ is None else environ)
  if wanted(environ):
    environ['GLIBC_TUNABLES'] = TUNABLES
  return environ


def reexec_with_tuned_malloc() -> None:
  """Replaces this process by itself started with TUNABLES (same pid, argv, environment)."""
  if wanted():
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], tuned_environ())


def peak_resident_mib() -> float:
  """This process's resident-memory high-water mark so far, in MiB (fine-tuning reports it
  after every seed)."""
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
  return peak / (1024 * 1024 if sys.platform == 'darwin' else 1024)


def resident_bytes() -> int:
  """This process's resident memory now (Linux: /proc/self/statm)."""
  with open('/proc/self/statm') as f:
    return int(f.read().split()[1]) * os.sysconf('SC_PAGE_SIZE')


@functools.cache
def _trim_limit() -> int | None:
  """Bytes above which `trim_if_over` trims: RESIDENT_SHARE of physical memory, in a process
  running with TUNABLES (None otherwise: glibc's own trimming is on)."""
  if os.environ.get('GLIBC_TUNABLES') != TUNABLES or not os.path.exists('/proc/self/statm'):
    return None
  return int(RESIDENT_SHARE * os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE'))


def trim_if_over(limit: int | None = None) -> bool:
  """Give the arena's free pages back to the kernel (glibc's `malloc_trim(0)`) when this
  process holds more than `limit` bytes (default: RESIDENT_SHARE of the machine, and only
  under TUNABLES). True when it trimmed. Cheap enough to call after every step."""
  limit = _trim_limit() if limit is None else limit
  if limit is None:
    return False
  held = resident_bytes()
  if held <= limit:
    return False
  global _trims
  ctypes.CDLL(None).malloc_trim(0)
  if not _trims:
    logging.info('host_malloc: %.1f GiB resident, over %.1f GiB: free memory returned to the '
                 'system (again whenever it is over; logged once)', held / 2**30, limit / 2**30)
  _trims += 1
  return True


_trims = 0  # how many times this process trimmed


def main(argv: list[str]) -> None:
  if not argv:
    raise SystemExit('usage: python -m bert_jax.training.host_malloc COMMAND [ARGS...]')
  try:
    os.execvpe(argv[0], argv, tuned_environ())
  except OSError as e:
    raise SystemExit(f'bert_jax.training.host_malloc: cannot run {argv[0]!r}: {e.strerror}; give a '
                     'command on PATH or its path') from e


if __name__ == '__main__':
  main(sys.argv[1:])
