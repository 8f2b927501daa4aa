"""Progress reporting for the training loops: a tqdm bar on a terminal, whole lines elsewhere.

A tqdm bar redraws itself with carriage returns. On a terminal that is what users want; in a
log file (`python -m bert_jax.finetune ... 2>&1 | tee log`, a batch scheduler, CI) every
redraw becomes another fragment of one endless line. So the bar is only drawn when its stream
(stderr, where tqdm writes) is a terminal; otherwise `LineProgress` writes one complete line
at most every `interval` seconds, and a last one at `close()`, with the same counters and
postfix. Both expose the part of tqdm's interface the loops use: update, set_postfix, write,
close.
"""

from __future__ import annotations

import sys
import time
from typing import IO


class LineProgress:
  """tqdm's interface, printing `desc: n/total unit (pct%), rate unit/s, key=value` lines."""

  def __init__(self, total: int, initial: int = 0, desc: str = '', unit: str = 'it',
               interval: float = 30.0, file: IO | None = None, disable: bool = False):
    self.total, self.n, self.desc, self.unit = total, initial, desc, unit
    self.interval, self.disable = interval, disable
    self._file = file
    self._postfix: dict[str, object] = {}
    self._start_n, self._start = initial, time.monotonic()
    self._last = self._start

  @property
  def file(self) -> IO:
    return self._file or sys.stderr  # looked up late: tests and absl swap sys.stderr

  def update(self, n: int = 1) -> None:
    self.n += n
    now = time.monotonic()
    if now - self._last >= self.interval:
      self._last = now
      self._print_line()

  def set_postfix(self, refresh: bool = True, **values) -> None:
    del refresh
    self._postfix = values

  def write(self, line: str) -> None:
    if not self.disable:
      print(line, file=self.file, flush=True)

  def close(self) -> None:
    if self.n != self._start_n:
      self._print_line()
    self._start_n = self.n  # a second close prints nothing new

  def line(self) -> str:
    seconds = max(time.monotonic() - self._start, 1e-9)
    done = f'{self.n}/{self.total}' if self.total else str(self.n)
    pct = f' ({100 * self.n / self.total:.0f}%)' if self.total else ''
    rate = (self.n - self._start_n) / seconds
    post = ''.join(f' {k}={v}' for k, v in self._postfix.items())
    return f'{self.desc}: {done} {self.unit}{pct}, {rate:.2f} {self.unit}/s{post}'

  def _print_line(self) -> None:
    self.write(self.line())


def progress_bar(total: int, initial: int = 0, desc: str = 'train', unit: str = 'step',
                 disable: bool = False, interval: float = 30.0):
  """A tqdm bar when stderr is a terminal, else a `LineProgress` (whole lines only)."""
  if sys.stderr.isatty():
    from tqdm import tqdm  # pylint: disable=g-import-not-at-top
    return tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                disable=disable, mininterval=1.0)
  return LineProgress(total, initial, desc, unit, interval=interval, disable=disable)
