"""Quorum voting on one replicated batch (``SV/store/internal/Voting.java``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class Voting:
    """Decided True once ``quorum`` votes arrive, False once more than ``voters - quorum`` abstain;
    ``on_decided`` is called with it once, when decided.

    The vote that reaches the quorum calls it at once (the commit then costs no loop turn more);
    a decision by abstentions calls it in the next loop turn, as abstentions come from replica
    sessions closing, in the middle of their own and their store session's state changes.
    Later votes and abstentions only count (``has_quorum``, ``has_abstention``).
    """

    def __init__(self, quorum: int, num_voters: int, on_decided: Callable[[Voting], None]) -> None:
        assert quorum >= 1 and num_voters >= 0
        self.quorum = quorum
        self.max_abstentions = num_voters - quorum
        self.num_votes = 0
        self.num_abstentions = 0
        self.decision: bool | None = None  # True: the quorum was reached
        self._on_decided = on_decided
        if self.max_abstentions < 0:
            # Too few connected replicas to ever reach the quorum.
            self._decide_later()

    def vote(self) -> None:
        self.num_votes += 1
        if self.num_votes >= self.quorum and self.decision is None:
            self.decision = True
            self._on_decided(self)

    def abstain(self) -> None:
        self.num_abstentions += 1
        if self.num_abstentions > self.max_abstentions and self.decision is None:
            self._decide_later()

    def _decide_later(self) -> None:
        self.decision = False
        asyncio.get_running_loop().call_soon(self._on_decided, self)

    @property
    def has_quorum(self) -> bool:
        return self.num_votes >= self.quorum

    @property
    def has_abstention(self) -> bool:
        return self.num_abstentions > 0

    def __repr__(self) -> str:
        return f"Voting(quorum={self.quorum}, votes={self.num_votes}, abstentions={self.num_abstentions})"
