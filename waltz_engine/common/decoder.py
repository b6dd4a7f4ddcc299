"""``--decoder module:function``: a user's function that turns record data into something readable.

The function takes the record's ``bytes`` and returns anything (a str, or a JSON-ready
value for ``--json``). The module is looked up on ``sys.path`` plus the current directory,
so ``--decoder mydecoders:orders`` finds ``./mydecoders.py`` like ``python -m`` would.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable

from waltz_engine.common.errors import WaltzError

Decoder = Callable[[bytes], object]

_SEPARATOR = ":"


class DecoderError(WaltzError):
    """The decoder named on the command line cannot be loaded."""


def load_decoder(spec: str) -> Decoder:
    """Import ``module:function`` (the function may be a dotted path, e.g. ``mod:Cls.parse``)."""
    module_name, separator, attribute_path = spec.partition(_SEPARATOR)
    if not (separator and module_name and attribute_path):
        raise DecoderError(f"decoder {spec!r}: expected module:function, e.g. mypackage.codecs:decode_order")
    module = _import(module_name, spec)
    target: object = module
    for name in attribute_path.split("."):
        try:
            target = getattr(target, name)
        except AttributeError:
            raise DecoderError(
                f"decoder {spec!r}: {module_name} has no attribute {attribute_path!r}"
            ) from None
    if not callable(target):
        raise DecoderError(f"decoder {spec!r}: {attribute_path} is a {type(target).__name__}, not a function")
    decoder: Decoder = target
    return decoder


def _import(module_name: str, spec: str) -> object:
    cwd = os.getcwd()
    added = cwd not in sys.path
    if added:
        sys.path.insert(0, cwd)
    try:
        return importlib.import_module(module_name)
    except Exception as e:  # noqa: BLE001 - whatever a user's module raises on import is reported in one line
        reason = " ".join(str(e).split())  # some import errors span lines; keep the message one line
        raise DecoderError(
            f"decoder {spec!r}: cannot import {module_name}: {type(e).__name__}: {reason}"
        ) from None
    finally:
        if added:
            sys.path.remove(cwd)


def try_decode(decoder: Decoder, data: bytes) -> tuple[object, str | None]:
    """``(decoder(data), None)``, or ``(None, "TypeName: message")`` when the decoder raises: a
    record it cannot read is shown with its error (one line), not the end of the command."""
    try:
        return decoder(data), None
    except Exception as e:  # noqa: BLE001 - a user's decoder may fail in any way; shown per record
        return None, f"{type(e).__name__}: {' '.join(str(e).split())}"
