"""A guard for the planted bugs (``planted_bugs``): a plant must fail the way its bug would, never
by a mistake of its own.

A plant replaces functions of today's code. When today's code moves on (a method takes one more
argument, an attribute is renamed), its replacement may raise a TypeError or an AttributeError
on every call; the world turns that into an application failure (a storage node answers the
request with an error, a task dies) and the replay "finds" the plant at its seed without the
bug it stands for ever running. That happened twice (issue 33: ``ack_before_sync``'s wrapper of
``Segment._write``, ``retry_worker_dies``'s wrapper).

:func:`plant` installs a plant through a :class:`GuardedPatch`, which checks each replacement
twice:

- as it is installed: the replacement accepts every call the function it replaces accepts (the
  same positional parameters by position, keyword-only ones by name), so a plant left behind by
  a signature change fails at once, even one its seed never calls;
- as it runs: a TypeError, AttributeError or NameError that leaves a replacement (raised by the
  plant's own code or by the original it calls) is recorded with the plant's and the function's
  names, and re-raised, so the world sees what it saw before.

These three are programming errors: no code of ours raises them on purpose, so one that leaves
a plant's replacement means the plant no longer fits the code it patches. AssertionError is
not among them: our asserts state invariants, and a plant's bug breaking one is a finding of
the bug (the simulator's checks are assertions of the same kind).
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, Protocol

import pytest

# What a plant fails by when it no longer fits the code it patches (see the module's text).
PROGRAMMING_ERRORS: tuple[type[BaseException], ...] = (TypeError, AttributeError, NameError)


class Patch(Protocol):
    """What a plant patches with (``pytest.MonkeyPatch`` or a :class:`GuardedPatch`)."""

    def setattr(self, target: Any, attribute: str, value: Any) -> None: ...


class PlantError(AssertionError):
    """A plant's replacement does not fit what it replaces, or failed by a programming error."""


class GuardedPatch:
    """What a plant is given in place of ``pytest.MonkeyPatch``: its ``setattr`` checks and
    wraps function replacements (see the module's text); the errors they raised are in
    :attr:`errors`."""

    def __init__(self, name: str, monkeypatch: pytest.MonkeyPatch) -> None:
        self.name = name
        self._monkeypatch = monkeypatch
        self.errors: list[str] = []

    def setattr(self, target: Any, attribute: str, value: Any) -> None:
        if isinstance(value, types.FunctionType):
            original = inspect.getattr_static(target, attribute)
            where = f"{getattr(target, '__name__', target)}.{attribute}"
            _check_fits(self.name, where, original, value)
            value = self._guarded(where, value)
        self._monkeypatch.setattr(target, attribute, value)

    def _guarded(self, where: str, replacement: Callable[..., Any]) -> Callable[..., Any]:
        record = functools.partial(self._record, where)
        if inspect.iscoroutinefunction(replacement):

            @functools.wraps(replacement)
            async def guarded_async(*args: Any, **kwargs: Any) -> Any:
                try:
                    return await replacement(*args, **kwargs)
                except PROGRAMMING_ERRORS as e:
                    record(e)
                    raise

            return guarded_async

        @functools.wraps(replacement)
        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return replacement(*args, **kwargs)
            except PROGRAMMING_ERRORS as e:
                record(e)
                raise

        return guarded

    def _record(self, where: str, error: BaseException) -> None:
        self.errors.append(f"{where}: {type(error).__name__}: {error}")

    def check(self) -> None:
        """Fail naming the plant and its first errors, if its replacements raised any."""
        if self.errors:
            shown = "; ".join(dict.fromkeys(self.errors))  # (the same error once, in order)
            raise PlantError(
                f"plant {self.name} failed by a programming error ({len(self.errors)} times), not "
                f"by its bug: {shown}"
            )


def _check_fits(name: str, where: str, original: Any, replacement: types.FunctionType) -> None:
    """The replacement binds every call the original's signature allows (by position up to its
    positional parameters, keyword-only ones by name): else it is a plant that no longer fits."""
    if not isinstance(original, types.FunctionType):
        raise PlantError(
            f"plant {name}: {where} is a {type(original).__name__}, which the guard cannot check "
            "(replace a plain function, or teach plant_guard this kind)"
        )
    wanted = inspect.signature(original)
    accepts = inspect.signature(replacement)
    required: list[Any] = []
    every: list[Any] = []
    keywords: dict[str, Any] = {}
    required_keywords: dict[str, Any] = {}
    for parameter in wanted.parameters.values():
        if parameter.kind in (parameter.POSITIONAL_ONLY, parameter.POSITIONAL_OR_KEYWORD):
            every.append(None)
            if parameter.default is parameter.empty:
                required.append(None)
        elif parameter.kind is parameter.VAR_POSITIONAL:
            every.append(None)  # (one more positional argument: the replacement takes it too)
        elif parameter.kind is parameter.KEYWORD_ONLY:
            keywords[parameter.name] = None
            if parameter.default is parameter.empty:
                required_keywords[parameter.name] = None
    for args, kwargs in ((required, required_keywords), (every, keywords)):
        try:
            accepts.bind(*args, **kwargs)
        except TypeError as e:
            raise PlantError(
                f"plant {name}: its {where}{accepts} does not fit today's {where}{wanted} ({e})"
            ) from None


def plant(name: str, install: Callable[[Patch], None], monkeypatch: pytest.MonkeyPatch) -> GuardedPatch:
    """Install the plant ``install`` (named ``name``) through a :class:`GuardedPatch`; call its
    :meth:`~GuardedPatch.check` after the seed ran."""
    guard = GuardedPatch(name, monkeypatch)
    install(guard)
    return guard
