"""Quorum voting on one replicated batch (``SV/store/internal/Voting.java``)."""

from __future__ import annotations

import asyncio


class Voting:
    """Decided True once ``quorum`` votes arrive, False once more than ``voters - quorum`` abstain."""

    def __init__(self, quorum: int, num_voters: int) -> None:
        assert quorum >= 1 and num_voters >= 0
        self.quorum = quorum
        self.max_abstentions = num_voters - quorum
        self.num_votes = 0
        self.num_abstentions = 0
        self._decided: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if self.max_abstentions < 0:
            # Too few connected replicas to ever reach the quorum.
            self._decided.set_result(False)

    def vote(self) -> None:
        self.num_votes += 1
        if self.num_votes >= self.quorum and not self._decided.done():
            self._decided.set_result(True)

    def abstain(self) -> None:
        self.num_abstentions += 1
        if self.num_abstentions > self.max_abstentions and not self._decided.done():
            self._decided.set_result(False)

    @property
    def has_quorum(self) -> bool:
        return self.num_votes >= self.quorum

    @property
    def has_abstention(self) -> bool:
        return self.num_abstentions > 0

    async def wait(self) -> bool:
        """True when the quorum was reached (a later abstention does not change that).

        Not shielded: a shield's outer future costs the commit one more event loop turn. The one
        waiter is the store session's append loop; when it is cancelled the decision is cancelled
        with it, and later votes and abstentions only count (``has_quorum``).
        """
        return await self._decided

    def __repr__(self) -> str:
        return f"Voting(quorum={self.quorum}, votes={self.num_votes}, abstentions={self.num_abstentions})"
