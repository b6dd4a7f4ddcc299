"""The workload the simulated world submits (a part of :class:`waltz_engine.sim.world.SimWorld`,
kept apart for size): each transaction's context, its submit until it went out, and the wait
until the application has applied every committed one."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from waltz_engine.client.client import WaltzClient
from waltz_engine.client.errors import AuthorizationError
from waltz_engine.common.errors import WaltzError
from waltz_engine.sim.bank import Ledger, Transfer
from waltz_engine.sim.loop import SimLoop
from waltz_engine.sim.workload import Application, ApplicationError, SimContext, payload, payload_size_bytes

if TYPE_CHECKING:
    from waltz_engine.sim.world import WorldShape

# The share of transactions that raise an application error when executed again (a retry).
REFUSES_RETRY_PROBABILITY = 0.1
# The mean time between two submits of a workload under faults, and an application's pause
# before it submits again a transaction whose submit failed.
SUBMIT_INTERVAL_S = 0.05
RESUBMIT_DELAY_S = 1.0


class WorkloadDriver:
    """The workload's submits (the world's state, which ``SimWorld`` sets)."""

    loop: SimLoop
    shape: WorldShape
    client: WaltzClient | None
    ledger: Ledger
    payloads: dict[int, bytes]
    application: Application
    contexts: list[SimContext]
    incarnation: int
    _client_up: asyncio.Event

    def _contexts(self) -> list[SimContext]:
        rng = self.loop.rng
        contexts: list[SimContext] = []
        for number in range(self.shape.transactions):
            outcome, refuses_retry = self.loop.create_future(), rng.random() < REFUSES_RETRY_PROBABILITY
            data = self.payloads[number] = payload(number, payload_size_bytes(rng))
            if self.shape.workload == "bank":
                self.ledger.plan(number, rng)
                contexts.append(Transfer(number, outcome, refuses_retry, self.ledger, data))
            else:
                contexts.append(SimContext(number, outcome, refuses_retry, data))
        return contexts

    async def _submit(self, context: SimContext) -> None:
        """Until the submit went out: the application tries again after a failed one."""
        while True:
            await self._client_up.wait()
            client = self.client
            assert client is not None
            context.incarnation = self.incarnation
            try:
                await client.submit(context)
                return
            except ApplicationError:
                return  # its own error on a resubmit: on_exception has it
            except AuthorizationError:
                return  # the ACLs refuse its partition: on_exception has it, final
            except WaltzError:
                # The submit failed (the partition was not mounted in time, the client closed),
                # after telling the context: that attempt's outcome was the submit's error.
                if context.outcome.done():
                    context.outcome.exception()  # read
                context.outcome = self.loop.create_future()
                await asyncio.sleep(RESUBMIT_DELAY_S)

    async def append_all(self) -> None:
        """Submit the workload's transactions and wait until the client has applied every committed one."""
        self.contexts = self._contexts()
        together = self.shape.submits_together
        assert together >= 1
        for first in range(0, len(self.contexts), together):
            if self.shape.faults > 0:
                await asyncio.sleep(self.loop.rng.expovariate(1 / (SUBMIT_INTERVAL_S * together)))
            group = self.contexts[first : first + together]
            if len(group) == 1:
                await self._submit(group[0])  # (one by one: no task, the schedule as before)
            else:
                await asyncio.gather(*(self._submit(context) for context in group))
        await asyncio.gather(*(context.outcome for context in self.contexts), return_exceptions=True)
        committed = {context.number for context in self.contexts if is_committed(context)}
        while not committed <= set(self.application.headers_seen()):
            self.application.changed.clear()
            await self.application.changed.wait()


def is_committed(context: SimContext) -> bool:
    outcome = context.outcome
    return outcome.done() and not outcome.cancelled() and outcome.exception() is None and outcome.result()
