"""`waltz inspect frame`: decode captured wire frames."""

from __future__ import annotations

import re
import sys
from typing import Any

import typer
from rich.markup import escape
from rich.tree import Tree

from waltz_cli.options import JsonOption
from waltz_cli.output import console, fail, one_line_errors, print_json
from waltz_engine.wire.describe import describe_frame

STDIN_ARGUMENT = "-"
# Separators people paste between bytes (hexdump, Wireshark "copy as hex stream", colons).
_SEPARATORS = re.compile(r"[\s:]+")
_HEX_PREFIX = "0x"


class _BadHex(ValueError):
    pass


def _parse_hex(text: str) -> bytes:
    digits = _SEPARATORS.sub("", text)
    if digits.lower().startswith(_HEX_PREFIX):
        digits = digits[len(_HEX_PREFIX) :]
    if not digits:
        raise _BadHex("no hex digits given")
    if len(digits) % 2:
        raise _BadHex(f"odd number of hex digits ({len(digits)})")
    try:
        return bytes.fromhex(digits)
    except ValueError:
        bad = next(c for c in digits if c not in "0123456789abcdefABCDEF")
        raise _BadHex(f"not a hex frame: unexpected character {bad!r}") from None


def _describe_hex(text: str) -> dict[str, Any]:
    try:
        return describe_frame(_parse_hex(text))
    except _BadHex as e:
        return {"error": str(e)}


def _add_value(tree: Tree, label: str, value: Any) -> None:
    if isinstance(value, dict):
        branch = tree.add(f"[bold]{escape(label)}[/]")
        for key, item in value.items():
            _add_value(branch, key, item)
    elif isinstance(value, list) and any(isinstance(item, dict | list) for item in value):
        branch = tree.add(f"[bold]{escape(label)}[/] ({len(value)} items)")
        for index, item in enumerate(value):
            _add_value(branch, f"[{index}]", item)
    else:
        shown = "null" if value is None else repr(value) if isinstance(value, str) else str(value)
        if isinstance(value, bool):
            shown = str(value).lower()
        tree.add(f"[bold]{escape(label)}[/] = {escape(shown)}")


def _render(description: dict[str, Any]) -> None:
    tree = Tree(
        f"[bold cyan]{escape(description['name'])}[/]  magic {description['magic']!r}  "
        f"version {description['version']}  type {description['type']}"
    )
    for key, value in description["fields"].items():
        _add_value(tree, key, value)
    console.print(tree)


def _describe_stdin() -> None:
    failed = False
    for line in sys.stdin:
        if not line.strip():
            continue
        description = _describe_hex(line)
        failed |= "error" in description
        print_json(description)
    if failed:
        raise typer.Exit(1)


@one_line_errors
def frame(
    hex_frame: str = typer.Argument(
        ...,
        metavar="HEX|-",
        help="One frame as hex (spaces, newlines and colons are ignored), or '-' to read one frame per line "
        "from stdin.",
        show_default=False,
    ),
    json_output: JsonOption = False,
) -> None:
    """Decode one wire frame given as hex and show every field.

    The codec is chosen by the magic byte ('H' hello, 'L' client-server v0-v4, 'S' storage, 'A' storage admin) and the version in the frame header. Byte arrays are shown as hex.

    With '-' every stdin line is one frame and every output line one JSON document ({"error": ...} for a frame that does not decode); the exit status is 1 if any frame failed.

    Example: waltz inspect frame --json 4800000000000a000000010000ffffffff

    Example (one frame per line): cat frames.hex | waltz inspect frame -
    """  # noqa: E501
    if hex_frame == STDIN_ARGUMENT:
        _describe_stdin()
        return
    description = _describe_hex(hex_frame)
    if "error" in description:
        fail(description["error"])
    if json_output:
        print_json(description)
    else:
        _render(description)
