"""A Ctrl-C during `waltz spark export` is one line and exit 130, also when py4j, interrupted
mid-call, raises its own error while handling it (the full process test is in
test_spark_export_cluster.py; this pins the chain that test met once under load)."""

from __future__ import annotations

from waltz_cli.commands.spark import _interrupted


class GatewayError(Exception):
    """As py4j's Py4JError: raised while the KeyboardInterrupt is being handled."""


def _raised_while_interrupted() -> BaseException:
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise GatewayError("Gateway must be connected to send cancel cmd.")  # noqa: B904
    except GatewayError as e:
        return e


def test_an_error_raised_while_handling_a_ctrl_c_counts_as_the_ctrl_c() -> None:
    assert _interrupted(KeyboardInterrupt())
    assert _interrupted(_raised_while_interrupted())


def test_other_errors_are_not_an_interrupt() -> None:
    assert not _interrupted(GatewayError("refused"))
    try:
        try:
            raise ValueError("first")
        except ValueError as first:
            raise GatewayError("second") from first
    except GatewayError as e:
        assert not _interrupted(e)
