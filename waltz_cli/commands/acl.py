"""`waltz acl grant | revoke | list`: who may append, read or administer which partitions.

A thin skin over :mod:`waltz_engine.auth.acl`: the entries live in ZooKeeper (``<root>/acl``),
every server and storage node with ``authorizer.enabled`` watches them, and a change is in force
within seconds, on open connections too. Deny wins over allow; no entry means no.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from waltz_cli import options
from waltz_cli.options import FROM_OPTIONS, Cluster, JsonOption, cluster_command
from waltz_cli.output import console, one_line_errors, print_json
from waltz_engine.auth.acl import (
    ALL_PARTITIONS,
    AclEntry,
    change_acls,
    make_entries,
    read_acls,
)
from waltz_engine.auth.zk_acls import secure_own_znodes
from waltz_engine.zk.connection import connect

app = options.group(help="ACLs: which principals may append, read or administer which partitions.")

PrincipalOption = Annotated[
    str,
    typer.Option(
        "--principal",
        help="Whom: a certificate's subject DN (CN=svc-a,O=payments), User:NAME (from a mapping rule), or *.",
    ),
]
OperationOption = Annotated[
    str, typer.Option("--operation", help="What: append, read and/or admin, comma-separated (append,read).")
]
PartitionsOption = Annotated[
    str,
    typer.Option("--partitions", help="Where: partition ids and ranges (0-3,7), or * for every partition."),
]
DenyOption = Annotated[bool, typer.Option("--deny", help="A deny entry (deny wins over any allow).")]


def _entries_json(entries: list[AclEntry] | tuple[AclEntry, ...]) -> list[dict[str, str]]:
    return [e.to_json() for e in entries]


def _change(cluster: Cluster, add: list[AclEntry], remove: list[AclEntry]) -> tuple[int, int]:
    settings = cluster.settings()
    with connect(settings) as client:
        # Our own znodes get the writers' ZooKeeper ACL first (a no-op without writers configured).
        if settings.auth is not None and settings.auth.writers:
            secure_own_znodes(client, settings.cluster_root, settings)
        before, after = change_acls(client, settings.cluster_root, add, remove)
    return len(after.entries) - len(before.entries), len(after.entries)


@app.command("grant")
@one_line_errors
@cluster_command
def grant(
    principal: PrincipalOption,
    operation: OperationOption,
    partitions: PartitionsOption = ALL_PARTITIONS,
    deny: DenyOption = False,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Allow (or with --deny, deny) a principal operations on partitions.

    Needs a ZooKeeper identity allowed to write the cluster's ACLs (zookeeper.auth.* in --config)
    once the authorizer secured them.

    Example: waltz acl grant --principal CN=svc-a --operation append,read --partitions 0-3

    Example: waltz acl grant --principal '*' --operation admin --partitions '*' --deny
    """
    entries = make_entries(principal, [operation], partitions, deny)
    added, total = _change(cluster, entries, [])
    if as_json:
        print_json({"granted": _entries_json(entries), "added": added, "entries": total})
        return
    for entry in entries:
        console.print(entry.describe(), markup=False, highlight=False)
    console.print(f"{added} entries added; {total} in all", markup=False)


@app.command("revoke")
@one_line_errors
@cluster_command
def revoke(
    principal: PrincipalOption,
    operation: OperationOption,
    partitions: PartitionsOption = ALL_PARTITIONS,
    deny: DenyOption = False,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Remove the entries a grant with the same options made (open feeds it allowed end).

    Example: waltz acl revoke --principal CN=svc-a --operation read --partitions 0-3
    """
    entries = make_entries(principal, [operation], partitions, deny)
    changed, total = _change(cluster, [], entries)
    removed = -changed
    if as_json:
        print_json({"revoked": _entries_json(entries), "removed": removed, "entries": total})
        return
    if removed == 0:
        console.print("no such entry: nothing revoked (see `waltz acl list`)", markup=False)
        return
    console.print(f"{removed} entries removed; {total} left", markup=False)


@app.command("list")
@one_line_errors
@cluster_command
def list_(
    principal: Annotated[
        str | None, typer.Option("--principal", help="Only this principal's entries (and *'s).")
    ] = None,
    cluster: Cluster = FROM_OPTIONS,
    as_json: JsonOption = False,
) -> None:
    """Every ACL entry of the cluster.

    Example: waltz acl list --json
    """
    from waltz_engine.auth.acl import AclError
    from waltz_engine.auth.principal import ANY_PRINCIPAL, PrincipalError, normalize_principal

    settings = cluster.settings()
    with connect(settings) as client:
        acls, version = read_acls(client, settings.cluster_root)
    entries = list(acls.entries)
    if principal is not None:
        try:
            who = normalize_principal(principal)
        except PrincipalError as e:
            raise AclError(str(e)) from None
        entries = [e for e in entries if e.principal in (who, ANY_PRINCIPAL)]
    if as_json:
        print_json({"entries": _entries_json(entries), "znode_version": version})
        return
    if not entries:
        console.print(
            "no ACL entries (with the authorizer on, nobody but the nodes may do anything)", markup=False
        )
        return
    table = Table("principal", "operation", "partitions", "permission")
    for entry in entries:
        table.add_row(entry.principal, entry.operation, entry.partitions, entry.permission)
    console.print(table)
