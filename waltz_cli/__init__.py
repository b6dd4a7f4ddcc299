"""The ``waltz`` command line.

Started as the ``waltz`` script or ``python -m waltz_cli``, a Ctrl-C while the command's modules
are still being imported (the first half second) ends it with one line and exit 130, where
Python would print a KeyboardInterrupt traceback; :func:`waltz_cli.main.main` then restores
Python's own handling, so that a running command cleans up after itself.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

INTERRUPTED_EXIT = 130  # 128 + SIGINT, as shells report it
_COMMAND_NAMES = ("waltz", "-m")  # sys.argv[0] of the script, and of `python -m` while importing


def _interrupted_while_starting(signum: int, frame: FrameType | None) -> None:
    os.write(sys.stderr.fileno(), b"error: interrupted\n")
    os._exit(INTERRUPTED_EXIT)  # nothing has started yet that would need stopping


if sys.argv and os.path.basename(sys.argv[0]) in _COMMAND_NAMES:
    signal.signal(signal.SIGINT, _interrupted_while_starting)
