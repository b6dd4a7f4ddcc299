"""`waltz inspect frame`: decode captured wire frames."""

from __future__ import annotations


def frame() -> None:
    """Decode a wire frame given as hex."""
    raise NotImplementedError
