"""Waltz engine: a byte-compatible Python implementation of Waltz 0.13.2.

Subpackages: ``wire`` (frames and message codecs), ``disk`` (on-disk formats, pure
encode/decode), ``storage`` (the storage engine and node), ``server``, ``client``
and ``zk`` (ZooKeeper metadata).
"""

__version__ = "0.1.0"
