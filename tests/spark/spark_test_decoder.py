"""A ``--decoder`` for the tests: record data as UTF-8 text (``spark_test_decoder:utf8``)."""

from __future__ import annotations


def utf8(data: bytes) -> str:
    return data.decode("utf-8")


UNREADABLE_PREFIX = b"unreadable"


def picky(data: bytes) -> str:
    """Fails on records that start with :data:`UNREADABLE_PREFIX` (for --on-decode-error)."""
    if data.startswith(UNREADABLE_PREFIX):
        raise ValueError("not a record this decoder knows")
    return data.decode("utf-8")
