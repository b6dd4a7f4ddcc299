"""Waltz engine: a byte-compatible Python implementation of Waltz 0.13.2.

Subpackages (docs/architecture.md walks through them): ``common`` (ids, records, checksums,
errors, config, metrics), ``net`` (framed TLS connections, TLS contexts, HTTP endpoints),
``wire`` (frames and message codecs), ``disk`` (read-only on-disk formats), ``storage`` (the
storage engine, node and admin operations), ``server`` (partitions and the store layer),
``client``, ``zk`` (ZooKeeper metadata and the cluster manager), ``ops`` (the operators'
library behind the ``waltz`` command), ``bench`` and ``smoke``.
"""

__version__ = "0.1.0"
