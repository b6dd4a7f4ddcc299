"""Every codec by (magic, version): how a frame of unknown origin finds its decoder."""

from __future__ import annotations

from typing import Any, TypeAlias

from waltz_engine.wire.admin_messages import ADMIN_CODEC
from waltz_engine.wire.client_messages import CLIENT_CODECS
from waltz_engine.wire.codec import MessageCodec
from waltz_engine.wire.errors import UnsupportedCodecError
from waltz_engine.wire.frame import magic_label
from waltz_engine.wire.hello import HELLO_CODEC, HelloCodec
from waltz_engine.wire.storage_messages import STORAGE_CODEC

AnyCodec: TypeAlias = MessageCodec[Any] | HelloCodec

ALL_CODECS: tuple[AnyCodec, ...] = (HELLO_CODEC, *CLIENT_CODECS.values(), STORAGE_CODEC, ADMIN_CODEC)

_BY_MAGIC_VERSION: dict[tuple[int, int], AnyCodec] = {(c.magic, c.version): c for c in ALL_CODECS}
assert len(_BY_MAGIC_VERSION) == len(ALL_CODECS)


def codec_for(magic: int, version: int) -> AnyCodec:
    codec = _BY_MAGIC_VERSION.get((magic, version))
    if codec is None:
        known = sorted(v for m, v in _BY_MAGIC_VERSION if m == magic)
        if not known:
            labels = ", ".join(magic_label(m) for m in sorted({m for m, _ in _BY_MAGIC_VERSION}))
            raise UnsupportedCodecError(
                f"unknown frame magic {magic_label(magic)}; known magics are {labels}"
            )
        raise UnsupportedCodecError(
            f"unsupported version {version} for magic {magic_label(magic)}; known versions are {known}"
        )
    return codec
