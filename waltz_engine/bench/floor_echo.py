"""The TLS echo process of `waltz bench floor` (python -m waltz_engine.bench.floor_echo)."""

from __future__ import annotations

import asyncio
import contextlib
import sys

from waltz_engine.bench.floor import serve_blocking_echo, serve_echo

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        if sys.argv[1:2] == ["blocking"]:  # the CPU floor's echo: blocking, on a thread
            serve_blocking_echo(int(sys.argv[2]))
        else:
            asyncio.run(serve_echo())
