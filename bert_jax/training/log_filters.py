"""Keep library chatter out of a run's log.

Orbax logs several INFO lines for every checkpoint save and restore (hundreds in a fine-tuning
run, around the ~35 lines a user reads); they come through absl's logger like ours, so
`logging.set_verbosity` would silence our own INFO lines too. This filter drops only the
INFO and DEBUG records whose source file lies in a quieted package; warnings and errors
from it still show.
"""

from __future__ import annotations

import logging as py_logging
import os

from absl import logging

QUIET_PACKAGES = ('orbax',)


class LibraryInfoFilter(py_logging.Filter):

  def __init__(self, packages=QUIET_PACKAGES):
    super().__init__()
    self._parts = tuple(f'{os.sep}{p}{os.sep}' for p in packages)

  def filter(self, record: py_logging.LogRecord) -> bool:
    if record.levelno >= py_logging.WARNING:
      return True
    return not any(part in record.pathname for part in self._parts)


def quiet_library_info() -> None:
  """Install the filter on absl's handler (once)."""
  handler = logging.get_absl_handler()
  if not any(isinstance(f, LibraryInfoFilter) for f in handler.filters):
    handler.addFilter(LibraryInfoFilter())
