"""`waltz storage decommission`: move every replica a storage node holds to other nodes (issue 24)."""

from __future__ import annotations

from typing import Annotated

import typer

from waltz_cli.options import (
    FROM_OPTIONS,
    Cluster,
    JsonOption,
    SslConfigOption,
    StorageOption,
    cluster_command,
)
from waltz_cli.output import console, err_console, one_line_errors, print_json
from waltz_engine.common.errors import without_java_class


@one_line_errors
@cluster_command
def decommission(
    storage: StorageOption,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the replica mover lease when another process holds it.")
    ] = False,
    delete_files: Annotated[
        bool, typer.Option("--delete-files", help="The node deletes each moved partition's files.")
    ] = False,
    bytes_per_second: Annotated[
        int,
        typer.Option(
            "--bytes-per-second",
            min=0,
            help="Bound on the bytes each copy moves a second: whole records, 40 bytes of header and "
            "checksums each with its data (0: none).",
        ),
    ] = 0,
    cluster: Cluster = FROM_OPTIONS,
    ssl_config: SslConfigOption = None,
    as_json: JsonOption = False,
) -> None:
    """Move every replica a storage node holds to other nodes, one partition at a time, while
    the log stays writable; run it again after an interruption and it finishes the job.

    Each partition gets a new replica on a live node (another group where the cluster has one),
    copied online, assigned, and caught up before the node leaves the assignment and is told it
    no longer holds the partition (its files are kept unless --delete-files). Once retention ran
    the copy starts at the retained start (the new replica's log begins there; a Java 0.13.2
    target is refused); a range only in the tier is read back from it (the plan printed first
    says how much). Exit 1 when the node still holds partitions at the end.

    Example: waltz storage decommission -c tools.yml -s storage-3:55280 --wait
    """
    from waltz_engine.ops.decommission import decommission as run

    def say(line: str) -> None:
        err_console.print(without_java_class(line), soft_wrap=True, markup=False)

    result = run(
        cluster.settings(),
        cluster.tls_context(ssl_config),
        storage,
        delete_files=delete_files,
        wait=wait,
        bytes_per_second=bytes_per_second,
        timeout_ms=cluster.timeout_ms,
        say=say,
        tls=cluster.tls_config(ssl_config),
    )
    if as_json:
        print_json(result.to_json())
    elif result.remaining:
        say_out(f"{result.storage} still holds partitions {result.remaining}")
    else:
        told = "" if not result.unreleased else f"; {len(result.unreleased)} to tell the node when it answers"
        say_out(f"{result.storage} holds no partition ({len(result.moves)} moved{told})")
    if result.remaining:
        raise typer.Exit(1)


def say_out(line: str) -> None:
    console.print(line, soft_wrap=True, markup=False)
