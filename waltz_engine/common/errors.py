"""The error hierarchy shared by every layer.

Every error a user can trigger with bad input derives from :class:`WaltzError`; the CLI
turns those into one-line messages. Anything else escaping is a bug.
"""

import re


class WaltzError(Exception):
    """Base of every expected, user-facing error."""


class ProtocolError(WaltzError):
    """Bytes on a connection do not form a valid frame or message."""


class ChecksumError(ProtocolError):
    """A message's data does not match the CRC-32 that travels with it."""


class FormatError(WaltzError):
    """A file on disk is not in the format it should be (truncated, foreign, corrupted)."""


class StorageError(WaltzError):
    """A storage operation was refused (out-of-order append, bad watermark, ...)."""


# The Java class names a storage node's FAILURE message begins with (the original's wire: servers
# parse what follows, so nodes keep them); ``without_java_class`` drops them where a person reads.
_JAVA_CLASS_PREFIX = re.compile(r"\b(?:com\.wepay\.waltz|java\.(?:lang|io))\.[\w.$]*: ")


def without_java_class(text: str) -> str:
    """``text`` without the ``com.wepay.…Exception: `` prefixes of the original's wire."""
    return _JAVA_CLASS_PREFIX.sub("", text)
