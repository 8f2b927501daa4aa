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
embedding step of 128 rows x 32 tokens). A bare loop of steps reuses it; a fine-tuning
command's first steps leave several behind in the one arena before it settles (8.5 GiB peak
against 2.8 GiB with glibc's defaults; steps 1.25-1.8x slower there; benchmarks/RESULTS.md,
"The CPU allocator", `python benchmarks/allocator.py`). Later seeds add nothing.
Where memory matters more than speed, set GLIBC_TUNABLES= (empty) before the command.

GLIBC_TUNABLES is read once, when a process starts, so the CPU entry points (`bert_jax.main`,
`bert_jax.finetune.run`, `bert_jax.demo`) re-execute themselves with it set, before their heavy
imports. Nothing happens where the variable is already set (set it, even to an empty string,
to keep your own), on a C library other than glibc, or where a GPU or TPU is attached (device
memory is not malloc'ed, and the host's input threads keep their per-thread arenas).

  python -m bert_jax.training.host_malloc COMMAND [ARGS...]   # runs COMMAND with the settings
"""

from __future__ import annotations

import glob
import os
import platform
import resource
import sys

TUNABLES = ('glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736:'
            'glibc.malloc.arena_max=1')
ACCELERATOR_DEVICES = ('/dev/nvidia[0-9]*', '/dev/accel[0-9]*', '/dev/vfio/[0-9]*')


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
