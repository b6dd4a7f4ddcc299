"""Quorum voting on a batch: the vote that reaches the quorum decides in the same step (the
commit costs no loop turn of its own); abstentions decide a turn later, outside the closing
replica session's state change."""

from __future__ import annotations

import asyncio

from waltz_engine.server.store.voting import Voting

QUORUM = 2
NUM_VOTERS = 3


def test_the_quorum_vote_decides_at_once_and_later_votes_only_count() -> None:
    async def go() -> None:
        decided: list[Voting] = []
        voting = Voting(QUORUM, NUM_VOTERS, decided.append)
        voting.vote()
        assert decided == [] and voting.decision is None
        voting.vote()
        assert decided == [voting] and voting.decision is True
        voting.abstain()
        await asyncio.sleep(0)  # nothing scheduled either
        assert decided == [voting] and voting.has_quorum and voting.has_abstention

    asyncio.run(go())


def test_abstentions_decide_in_the_next_loop_turn_once() -> None:
    async def go() -> None:
        decided: list[Voting] = []
        voting = Voting(QUORUM, NUM_VOTERS, decided.append)
        voting.abstain()
        voting.abstain()
        assert decided == [] and voting.decision is False
        voting.vote()
        voting.abstain()
        await asyncio.sleep(0)
        assert decided == [voting] and not voting.has_quorum

    asyncio.run(go())


def test_too_few_voters_decide_no_quorum() -> None:
    async def go() -> None:
        decided: list[Voting] = []
        voting = Voting(QUORUM, QUORUM - 1, decided.append)
        await asyncio.sleep(0)
        assert decided == [voting] and voting.decision is False

    asyncio.run(go())
