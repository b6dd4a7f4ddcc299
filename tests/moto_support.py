"""A local S3 server (moto) for tests of what writes through ``pyarrow.fs``: backups and the
storage node's tier."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from testkit import free_tcp_port

CREDENTIALS = (
    ("AWS_ACCESS_KEY_ID", "test"),
    ("AWS_SECRET_ACCESS_KEY", "test"),
    ("AWS_DEFAULT_REGION", "us-east-1"),
)


@contextmanager
def moto_s3_url(bucket: str, prefix: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """An ``s3://`` URL of a new bucket on a moto server that lives as long as the block. The
    credentials go to the environment, which node processes started meanwhile inherit."""
    from moto.server import ThreadedMotoServer
    from pyarrow.fs import S3FileSystem

    port = free_tcp_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for name, value in CREDENTIALS:
        monkeypatch.setenv(name, value)
    try:
        S3FileSystem(
            access_key="test",
            secret_key="test",
            region="us-east-1",
            scheme="http",
            endpoint_override=f"127.0.0.1:{port}",
            allow_bucket_creation=True,
        ).create_dir(bucket)
        yield f"s3://{bucket}/{prefix}?endpoint_override=127.0.0.1:{port}&scheme=http&region=us-east-1"
    finally:
        server.stop()
