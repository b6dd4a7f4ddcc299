"""What every part of Waltz shares (the original's ``waltz-common``).

Ids and records (``reqid``, ``record``: reference §0.2, §1.4), checksums (``crc``), the lock
hash (``lock_hash``: §2.6), errors, YAML configuration (``config``: §0.3), metrics (§1.8, §2.9),
host:port addresses, durable file writes (``fileio``), running a node as a process
(``process``) and user data decoders (``decoder``).
"""
