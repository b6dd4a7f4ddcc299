"""One grammar for every command: walks the whole `waltz` tree (pure Python, no cluster).

Every command's help has an example; a short flag means one thing everywhere; hidden aliases
point at flags that exist and stay out of the help; times carry their unit in the flag's name;
commands that talk to a cluster find it the same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from waltz_cli.main import app
from waltz_cli.options import ALIASES, SHORT_FLAGS

ROOT = typer.main.get_command(app)
CLUSTER_FLAGS = {"--config": "-c", "--zookeeper": "-z", "--cluster-root": "-r"}
ENV_OF = {
    "--config": "WALTZ_CONFIG",
    "--zookeeper": "WALTZ_ZOOKEEPER",
    "--cluster-root": "WALTZ_CLUSTER_ROOT",
}
# Flags that are a time: the unit is in the name (`--timeout-ms`, `--duration-s`).
TIME_WORDS = ("timeout", "interval", "duration", "delay", "seconds", "wait")
TIME_UNITS = ("-ms", "-s", "-seconds", "-minutes")
HELP_WIDTH_COLUMNS = 80


def leaves(command: Any = ROOT, path: tuple[str, ...] = ("waltz",)) -> Iterator[tuple[str, Any]]:
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            yield from leaves(sub, (*path, name))
    else:
        yield " ".join(path), command


LEAVES = dict(leaves())


def options(command: Any) -> list[Any]:
    return [p for p in command.params if p.param_type_name == "option"]


def test_the_tree_is_whole() -> None:
    assert len(LEAVES) >= 59, sorted(LEAVES)


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_help_has_an_example(path: str) -> None:
    help_text = LEAVES[path].help or ""
    examples = re.findall(r"^\s*Example[s]?:\s*(waltz .+)$", help_text, re.MULTILINE)
    assert examples, f"`{path} --help` has no 'Example: waltz ...' line"
    for example in examples:
        assert example.startswith(path), f"`{path}`'s example runs another command: {example}"


def test_a_short_flag_has_one_meaning_everywhere() -> None:
    meanings: dict[str, set[tuple[str, str]]] = {}
    for path, command in LEAVES.items():
        for option in options(command):
            names = [*option.opts, *option.secondary_opts]
            longs = [n for n in names if n.startswith("--")]
            for short in (n for n in names if re.fullmatch(r"-[A-Za-z]", n)):
                meanings.setdefault(short, set()).add((longs[0] if longs else "?", path))
    for short, uses in sorted(meanings.items()):
        longs = {long for long, _ in uses}
        assert longs == {SHORT_FLAGS.get(short)}, (
            f"{short} means {sorted(longs)} (glossary: {SHORT_FLAGS.get(short)}); "
            f"in {sorted(path for _, path in uses)[:6]}"
        )


def test_no_multi_letter_single_dash_flag_is_shown() -> None:
    for path, command in LEAVES.items():
        for option in options(command):
            odd = [n for n in (*option.opts, *option.secondary_opts) if re.fullmatch(r"-[A-Za-z]{2,}", n)]
            assert not odd, f"{path} shows {odd}: make them hidden aliases in waltz_cli.options.ALIASES"


def test_every_alias_points_at_a_flag_some_command_has() -> None:
    every_flag = {n for c in LEAVES.values() for o in options(c) for n in (*o.opts, *o.secondary_opts)}
    for alias, target in ALIASES.items():
        assert alias not in every_flag, f"alias {alias} is also a visible flag"
        assert target in every_flag, f"alias {alias} points at {target}, which no command has"


def test_times_carry_their_unit() -> None:
    for path, command in LEAVES.items():
        for option in options(command):
            for name in (n for n in option.opts if n.startswith("--")):
                if any(word in name for word in TIME_WORDS) and option.is_flag is False:
                    assert name.endswith(TIME_UNITS), f"{path} {name}: say the unit, e.g. {name}-ms"


def test_switches_show_no_value_placeholder() -> None:
    result = CliRunner().invoke(app, ["tail", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0
    assert "<bool>" not in result.output


def test_cluster_commands_find_the_cluster_the_same_way() -> None:
    talking = 0
    for path, command in LEAVES.items():
        flags = {n: o for o in options(command) for n in o.opts if n.startswith("--")}
        if not {"--zookeeper", "--cluster-root"} & set(flags):
            continue
        talking += 1
        for long, short in CLUSTER_FLAGS.items():
            assert long in flags, f"{path} talks to a cluster but has no {long}"
            option = flags[long]
            assert short in option.opts, f"{path} {long} lacks {short}"
            assert option.envvar == ENV_OF[long], f"{path} {long} is not read from ${ENV_OF[long]}"
    assert talking >= 30


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["client", "validate", "-tpc", "5", "-nc", "2", "--help"], 0),
        (["storage", "max-transaction-id", "-sp", "1", "--help"], 0),
    ],
)
def test_hidden_aliases_are_accepted(argv: list[str], expected: int) -> None:
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == expected, result.output


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_help_fits_80_columns_without_cutting_a_word(path: str) -> None:
    """At 80 columns (a small terminal, or a pipe) no option name or help word is cut short with
    an ellipsis, and no line is wider than the terminal."""
    result = CliRunner().invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "…" not in result.output, result.output
    assert max(len(line) for line in result.output.splitlines()) <= HELP_WIDTH_COLUMNS


def test_every_cluster_command_has_one_timeout_flag_and_the_old_name_is_hidden() -> None:
    timed = 0
    for path, command in LEAVES.items():
        flags = [n for o in options(command) for n in o.opts]
        waits = [f for f in flags if "timeout" in f and f != "--idle-timeout-ms"]  # consumer's silence
        assert waits in ([], ["--timeout-ms"]), (path, waits)
        timed += bool(waits) and "--cluster-root" in flags
    assert timed >= 30
    result = CliRunner().invoke(app, ["zk", "list", "--connect-timeout-ms", "0"])
    assert result.exit_code == 2 and "'--timeout-ms'" in result.stderr  # the alias reaches the flag


def test_a_default_is_stated_once() -> None:
    """Help that names its default in words is not followed by typer's own ``[default: ...]``."""
    for path, command in LEAVES.items():
        for option in options(command):
            says_default = "default" in (option.help or "").lower()
            shown = (
                option.default is not None
                and option.default is not False
                and option.show_default is not False
            )
            assert not (says_default and shown and not option.hidden), f"{path} {option.opts[0]}"


OWN_LINE = ("Example", "- ", "* ", "• ", "$ ")


@pytest.mark.parametrize("path", sorted(LEAVES))
def test_help_paragraphs_are_wrapped_once(path: str) -> None:
    """On a terminal wide enough for any paragraph, a help paragraph is one line (apart from
    examples and list items): a line break the docstring's source wrapping left in would come
    back as ragged text on every terminal, wrapped twice (issue 31)."""
    result = CliRunner().invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "1000"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    description = lines[: next(i for i, line in enumerate(lines) if line.lstrip().startswith("╭"))]
    text = [line.strip() for line in description if not line.strip().startswith("Usage:")]
    for before, line in zip(text, text[1:], strict=False):
        if before and line and not line.startswith(OWN_LINE):
            pytest.fail(f"`{path} --help` breaks a paragraph before {line!r}:\n{result.output}")
