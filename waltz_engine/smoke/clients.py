"""The smoke runner's side of the client processes (``waltz_engine.smoke.workload``): start,
follow their progress lines, steer them through stdin, read back what they recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from waltz_engine.smoke import workload
from waltz_engine.smoke.checks import Applied

EXIT_TIMEOUT_S = 30.0
STDERR_FILE = "client.log"
NO_TRANSACTION = -1


@dataclass
class ClientProcess:
    name: str
    out: Path
    process: asyncio.subprocess.Process
    progress: dict[str, Any] = field(default_factory=dict)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(
        cls, name: str, out: Path, config: Path, seed: int, limit: int, overrides: Mapping[str, str]
    ) -> ClientProcess:
        out.mkdir(parents=True, exist_ok=True)
        with (out / STDERR_FILE).open("ab") as log:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                workload.__name__,
                "--config",
                str(config),
                "--out",
                str(out),
                "--seed",
                str(seed),
                "--transactions",
                str(limit),
                "--overrides",
                json.dumps(dict(overrides)),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the runner, which stops it in order
            )
        client = cls(name, out, process)
        client._reader = asyncio.create_task(client._follow())
        return client

    async def _follow(self) -> None:
        assert self.process.stdout is not None
        while line := await self.process.stdout.readline():
            with contextlib.suppress(ValueError):
                self.progress = json.loads(line)

    @property
    def state(self) -> str:
        return str(self.progress.get("state", workload.STARTING))

    def count(self, key: str) -> int:
        return int(self.progress.get(key, 0))

    def mark(self, partition_id: int) -> int:
        return int(self.progress.get("marks", {}).get(str(partition_id), NO_TRANSACTION))

    @property
    def exited(self) -> bool:
        return self.process.returncode is not None

    async def send(self, command: str) -> None:
        assert self.process.stdin is not None
        if self.exited:
            return
        with contextlib.suppress(ConnectionError):
            self.process.stdin.write(f"{command}\n".encode())
            await self.process.stdin.drain()

    async def finish(self) -> int:
        """``exit``, then wait (bounded; killed after that) for the process and its last line."""
        await self.send(workload.EXIT)
        try:
            async with asyncio.timeout(EXIT_TIMEOUT_S):
                await self.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            await self._reader
        return self.process.returncode or 0

    def committed(self) -> list[tuple[str, float]]:
        """(UUID hex, latency ms) of every context that completed."""
        records = []
        with (self.out / workload.COMMITTED_FILE).open(encoding="ascii") as lines:
            for line in lines:
                data, latency_ms = line.split()
                records.append((data, float(latency_ms)))
        return records

    def told(self, file_name: str) -> list[str]:
        """The UUIDs of one outcome file (``workload.NOT_COMMITTED_FILE``, ``UNKNOWN_FILE``)."""
        with (self.out / file_name).open(encoding="ascii") as lines:
            return [line.strip() for line in lines if line.strip()]

    def applied(self) -> list[Applied]:
        records = []
        with (self.out / workload.APPLIED_FILE).open(encoding="ascii") as lines:
            for line in lines:
                partition_id, transaction_id, data = line.split()
                records.append(Applied(int(partition_id), int(transaction_id), data))
        return records
