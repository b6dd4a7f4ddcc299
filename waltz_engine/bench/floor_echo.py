"""The TLS echo process of `waltz bench floor` (python -m waltz_engine.bench.floor_echo)."""

from __future__ import annotations

import asyncio
import contextlib

from waltz_engine.bench.floor import serve_echo

if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_echo())
