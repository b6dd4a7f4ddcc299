"""A ``--decoder`` for the tests: record data as UTF-8 text (``spark_test_decoder:utf8``)."""

from __future__ import annotations


def utf8(data: bytes) -> str:
    return data.decode("utf-8")
