"""Why bytes on a connection were refused, or why a message could not be encoded.

Every class derives from :class:`waltz_engine.common.errors.ProtocolError`, so a connection
handler needs one ``except`` to close the connection on any of them.
"""

from __future__ import annotations

from waltz_engine.common.errors import ChecksumError, ProtocolError


class FrameHeaderError(ProtocolError):
    """A frame header has the wrong magic byte or version for the connection's codec."""


class FrameTooLargeError(ProtocolError):
    """A frame header announces a negative length or more than the allowed maximum."""


class TruncatedFrameError(ProtocolError):
    """The bytes end inside a frame."""


class UnsupportedCodecError(ProtocolError):
    """No codec exists for a frame's magic byte and version."""


class UnknownMessageTypeError(ProtocolError):
    """The message type byte is not one the codec version knows."""


class TruncatedMessageError(ProtocolError):
    """The payload ends before the message does."""


class TrailingBytesError(ProtocolError):
    """The payload goes on after the message ends."""


class NegativeLengthError(ProtocolError):
    """A length or count is negative where the format has no null form."""


class InvalidValueError(ProtocolError):
    """A value decodes but cannot be represented (bad UTF-8, null where none is allowed)."""


class DataChecksumError(ChecksumError):
    """The CRC-32 carried with a message's data does not match the data."""


class HandshakeFailedError(ProtocolError):
    """The two Hello frames share no codec version."""


class EncodeError(ProtocolError):
    """A message cannot be encoded by this codec version (as the original's encoder refuses)."""
